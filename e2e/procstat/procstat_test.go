package procstat

import (
	"os"
	"testing"
)

// TestSelf: this process's own stat and status read back as a live
// process's: its pid and parent, some CPU time, a resident size and a peak
// no lower than it.
func TestSelf(t *testing.T) {
	pid := os.Getpid()
	for range 1_000_000 { // some CPU time to see
		_ = make([]byte, 64)
	}
	st, ok := Read(pid)
	if !ok {
		t.Fatal("Read of this process failed")
	}
	if st.PID != pid || st.PPID != os.Getppid() {
		t.Errorf("pid %d ppid %d, want %d %d", st.PID, st.PPID, pid, os.Getppid())
	}
	if st.RSS <= 0 || st.CPU() < 0 {
		t.Errorf("RSS %d, CPU %v", st.RSS, st.CPU())
	}
	if hwm := StatusBytes(pid, "VmHWM:"); hwm < st.RSS/2 || hwm <= 0 {
		t.Errorf("VmHWM %d bytes, RSS %d", hwm, st.RSS)
	}
	if _, ok := Read(-1); ok {
		t.Error("Read of no process succeeded")
	}
	if v := StatusBytes(-1, "VmHWM:"); v != 0 {
		t.Errorf("StatusBytes of no process = %d", v)
	}
}
