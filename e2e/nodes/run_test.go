package nodes

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestJobFilesMountedOver(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	os.WriteFile(base, nil, 0o644)
	host := filepath.Join(dir, "file")
	os.WriteFile(host, []byte("x"), 0o644)
	for _, guest := range []string{"/tmp/x", "/run/x", "/var/run/x", "/proc/x", "/init", "/etc/nodes/job/script", "relative"} {
		if err := writeJobInitrd(filepath.Join(dir, "initrd"), base, Job{Files: map[string]string{guest: host}}, "n"); err == nil {
			t.Errorf("job file %s: no error", guest)
		}
	}
	if err := writeJobInitrd(filepath.Join(dir, "initrd"), base, Job{Files: map[string]string{"/bin/x": host}, Script: "true"}, "n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "initrd"))
	var names []string
	for _, e := range readCPIO(t, b) {
		names = append(names, e.name)
	}
	// /bin is a link to usr/bin in the base archive: the job's file goes
	// where it leads, or unpacking would replace the link with a directory.
	want := []string{"usr", "usr/bin", "usr/bin/x", "etc", "etc/nodes", "etc/nodes/job", "etc/nodes/job/nonce", "etc/nodes/job/script"}
	if !slices.Equal(names, want) {
		t.Errorf("job archive %v, want %v", names, want)
	}
}

func TestReadConsole(t *testing.T) {
	const marker = "nodes-0123456789abcdef"
	console := "SeaBIOS\r\nBooting from ROM..\x1b[2J" + marker + " init\r\n" +
		"nodes: insmod x: failed\r\n" +
		"nodes-0000000000000000 exit 7\r\n" + // another run's marker: not this one's
		marker + " ready\r\n" + marker + " exit 3\r\n[    5.9] reboot: Power down\r\n"
	c := <-readConsole(strings.NewReader(console), marker, time.Now(), nil, nil)
	if !c.exited || c.status != 3 {
		t.Errorf("exited %v with %d, want exit 3", c.exited, c.status)
	}
	if strings.Contains(c.text, "\r") || !strings.HasSuffix(c.text, "Power down\n") {
		t.Errorf("console text %q", c.text)
	}
	c = <-readConsole(strings.NewReader(marker+" init\nKernel panic\n"), marker, time.Now(), nil, nil)
	if c.exited {
		t.Error("no exit line, but exited")
	}
}
