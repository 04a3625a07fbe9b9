package main

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/procstat"
)

// CPU time and memory of a proxy and every process it spawns (upstream
// kube-proxy runs `nft` for each sync), from /proc:
//   - CPU: utime+stime of the proxy plus cutime+cstime (its reaped
//     children, and theirs), plus utime+stime of descendants still alive.
//   - memory: the proxy's own high-water mark (VmHWM, exact) and the peak,
//     sampled every sampleEvery, of the summed RSS of the whole process tree.

// sampleEvery is how often the process tree's RSS is sampled.
const sampleEvery = 50 * time.Millisecond

// descendants returns the live processes below pid (not pid itself).
func descendants(pid int) []procstat.Stat {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]procstat.Stat{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := procstat.Read(p); ok {
			children[st.PPID] = append(children[st.PPID], st)
		}
	}
	var out []procstat.Stat
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.PID)
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
	st, ok := procstat.Read(s.pid)
	if !ok {
		return
	}
	total := st.RSS
	for _, d := range descendants(s.pid) {
		total += d.RSS
	}
	s.mu.Lock()
	s.peakTree = max(s.peakTree, total)
	s.mu.Unlock()
}

// cpu is the CPU time (user+system, seconds) used so far by the proxy and
// all its descendants, alive or reaped.
func (s *sampler) cpu() float64 {
	st, ok := procstat.Read(s.pid)
	if !ok {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.lastCPU
	}
	total := st.CPU() + st.Cutime + st.Cstime
	for _, d := range descendants(s.pid) {
		total += d.CPU()
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
	proc = procstat.StatusBytes(s.pid, "VmHWM:")
	s.mu.Lock()
	defer s.mu.Unlock()
	return proc, max(s.peakTree, proc)
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
