package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CPU time and memory of a proxy and every process it spawns (upstream
// kube-proxy runs `nft` for each sync), from /proc:
//   - CPU: utime+stime of the proxy plus cutime+cstime (its reaped
//     children, and theirs), plus utime+stime of descendants still alive.
//   - memory: the proxy's own high-water mark (VmHWM, exact) and the peak,
//     sampled every sampleEvery, of the summed RSS of the whole process tree.

const (
	clockTicks  = 100 // USER_HZ on Linux
	sampleEvery = 50 * time.Millisecond
)

type procStat struct {
	pid, ppid                    int
	utime, stime, cutime, cstime float64 // seconds
	rss                          int64   // bytes
}

var pageSize = int64(os.Getpagesize())

// readStat parses /proc/<pid>/stat.
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 22 {
		return procStat{}, false
	}
	num := func(k int) float64 { v, _ := strconv.ParseFloat(f[k-3], 64); return v }
	return procStat{
		pid: pid, ppid: int(num(4)),
		utime: num(14) / clockTicks, stime: num(15) / clockTicks,
		cutime: num(16) / clockTicks, cstime: num(17) / clockTicks,
		rss: int64(num(24)) * pageSize,
	}, true
}

// descendants returns the live processes below pid (not pid itself).
func descendants(pid int) []procStat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]procStat{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readStat(p); ok {
			children[st.ppid] = append(children[st.ppid], st)
		}
	}
	var out []procStat
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// sampler follows one proxy process from its start until stop.
type sampler struct {
	pid      int
	stopc    chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	peakTree int64
	lastCPU  float64
}

func startSampler(pid int) *sampler {
	s := &sampler{pid: pid, stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-s.stopc:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) sample() {
	st, ok := readStat(s.pid)
	if !ok {
		return
	}
	total := st.rss
	for _, d := range descendants(s.pid) {
		total += d.rss
	}
	s.mu.Lock()
	s.peakTree = max(s.peakTree, total)
	s.mu.Unlock()
}

// cpu is the CPU time (user+system, seconds) used so far by the proxy and
// all its descendants, alive or reaped.
func (s *sampler) cpu() float64 {
	st, ok := readStat(s.pid)
	if !ok {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.lastCPU
	}
	total := st.utime + st.stime + st.cutime + st.cstime
	for _, d := range descendants(s.pid) {
		total += d.utime + d.stime
	}
	s.mu.Lock()
	s.lastCPU = total
	s.mu.Unlock()
	return total
}

// stop ends sampling (call it before the process exits) and returns the
// proxy's own peak RSS (VmHWM) and the sampled peak RSS of its process tree,
// both in bytes; the tree's is at least the proxy's.
func (s *sampler) stop() (proc, tree int64) {
	s.sample()
	close(s.stopc)
	<-s.done
	proc = vmHWM(s.pid)
	s.mu.Lock()
	defer s.mu.Unlock()
	return proc, max(s.peakTree, proc)
}

func vmHWM(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(rest), &kb)
			return kb << 10
		}
	}
	return 0
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
