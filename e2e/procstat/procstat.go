// Package procstat reads a process's CPU time and memory from /proc, for
// the benches that measure proxies and the API server.
package procstat

import (
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ on Linux, the unit of /proc/PID/stat's times.
const clockTicks = 100

var pageSize = int64(os.Getpagesize())

// Stat is what the benches read of /proc/PID/stat.
type Stat struct {
	PID, PPID                    int
	Utime, Stime, Cutime, Cstime float64 // seconds
	RSS                          int64   // bytes
}

// CPU is the process's own user and system time, in seconds.
func (s Stat) CPU() float64 { return s.Utime + s.Stime }

// Read parses /proc/PID/stat; false if the process is gone.
func Read(pid int) (Stat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return Stat{}, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 22 {
		return Stat{}, false
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k-3], 64); return v }
	return Stat{
		PID: pid, PPID: int(num(4)),
		Utime: num(14) / clockTicks, Stime: num(15) / clockTicks,
		Cutime: num(16) / clockTicks, Cstime: num(17) / clockTicks,
		RSS: int64(num(24)) * pageSize,
	}, true
}

// StatusBytes reads a "kB" field of /proc/PID/status ("VmHWM:"), in bytes;
// 0 if the process is gone.
func StatusBytes(pid int, field string) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				v, _ := strconv.ParseInt(f[0], 10, 64)
				return v << 10
			}
		}
	}
	return 0
}
