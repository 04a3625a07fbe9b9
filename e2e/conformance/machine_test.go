package conformance

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSCTPProblem: the probe agrees with /proc/net/sctp, which a kernel
// with SCTP has once its first SCTP socket was made (the probe's).
func TestSCTPProblem(t *testing.T) {
	problem := SCTPProblem()
	_, err := os.Stat("/proc/net/sctp")
	if (problem == "") != (err == nil) {
		t.Errorf("SCTPProblem() = %q but /proc/net/sctp: %v", problem, err)
	}
}

func TestDetectMachine(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "packages.txt")
	os.WriteFile(list, []byte("bash 5.2.15-2+b9\niperf 2.1.8+dfsg-1\n"), 0o644)
	m, err := DetectMachine(list)
	if err != nil {
		t.Fatal(err)
	}
	if m.Lacks[NeedIperf22] == "" {
		t.Errorf("iperf 2.1.8 not found lacking: %+v", m)
	}
	os.WriteFile(list, []byte("iperf 2.2.1+dfsg-1\n"), 0o644)
	if m, err := DetectMachine(list); err != nil || m.Lacks[NeedIperf22] != "" {
		t.Errorf("iperf 2.2.1: %+v %v", m, err)
	}
	os.WriteFile(list, []byte("bash 5.2.15-2+b9\n"), 0o644)
	if _, err := DetectMachine(list); err == nil {
		t.Error("a list without iperf was accepted")
	}
}
