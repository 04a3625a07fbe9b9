package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nftproxy/nftproxy/e2e/procstat"
	"github.com/nftproxy/nftproxy/e2e/promtext"
)

// What a phase cost the API server.
type apiCost struct {
	CPUSeconds float64 `json:"cpuSeconds"`
	PeakRSS    int64   `json:"peakRSSBytes"`
	// SentBytes is what the control namespace sent onto the node fabric
	// (its bridge's transmitted bytes): the API server's answers and
	// watch events to every node, TLS included.
	SentBytes uint64 `json:"sentBytes"`
	// From the API server's metrics, for Services and EndpointSlices:
	Lists float64 `json:"lists"` // LIST requests
	// WatchLists are watches that streamed the objects first (a
	// reflector's list as a watch, client-go's WatchListClient), counted
	// when their initial events were sent.
	WatchLists      float64 `json:"watchLists"`
	ListsFromCache  float64 `json:"listsFromCache"`
	ListsFromEtcd   float64 `json:"listsFromEtcd"`   // etcd list calls, the watch cache's own included
	TooManyRequests float64 `json:"tooManyRequests"` // 429s, any request
	Rejected        float64 `json:"rejected"`        // API Priority and Fairness rejections
	WatchEventBytes float64 `json:"watchEventBytes"`
	SliceWrites     float64 `json:"sliceWrites"` // EndpointSlice create, update, patch and delete requests
	// Watches open at the phase's end (not a difference): of Nodes, and of
	// Services and EndpointSlices. Once every proxy is settled both
	// columns hold as many; after a storm, the watches of a proxy still
	// backing off are missing.
	NodeWatches       float64 `json:"nodeWatches"`
	ProxyWatches      float64 `json:"proxyWatches"`
	MetricsUnreadable bool    `json:"metricsUnreadable,omitempty"`
}

// meter measures the API server from its start to its stop.
type meter struct {
	cl      *cluster
	pid     int
	cpu0    float64
	tx0     uint64
	m0      promtext.Scrape
	stopped chan struct{}
	wg      sync.WaitGroup
	peak    int64
}

// apiPID is the running API server's process.
func (cl *cluster) apiPID() int { return cl.bed.ControlPlanePIDs()[0] }

// startMeter starts measuring the running API server. fresh: it has just
// started, and what it did since its start belongs to the phase (CPU,
// counters and peak memory from zero); otherwise its peak memory is reset
// to now (/proc/PID/clear_refs) and its counters read as a baseline. tx0 is
// the fabric's byte count at the phase's start.
func (cl *cluster) startMeter(fresh bool, tx0 uint64) *meter {
	m := &meter{cl: cl, pid: cl.apiPID(), tx0: tx0, stopped: make(chan struct{})}
	if !fresh {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", m.pid), []byte("5"), 0)
		m.cpu0 = cpuSeconds(m.pid)
		m.m0, _ = cl.apiMetrics()
	}
	m.wg.Go(func() {
		for {
			m.sample()
			select {
			case <-m.stopped:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	return m
}

// sample keeps the peak of the API server's resident memory (VmHWM, which
// the kernel keeps exactly; read while the process lives).
func (m *meter) sample() {
	if v := procstat.StatusBytes(m.pid, "VmHWM:"); v > m.peak {
		m.peak = v
	}
}

// stop ends the measurement.
func (m *meter) stop() apiCost {
	close(m.stopped)
	m.wg.Wait()
	m.sample()
	c := apiCost{CPUSeconds: cpuSeconds(m.pid) - m.cpu0, PeakRSS: m.peak, SentBytes: m.cl.txBytes() - m.tx0}
	m1, err := m.cl.apiMetrics()
	if err != nil {
		c.MetricsUnreadable = true
		return c
	}
	d := func(name string, match map[string]string) float64 {
		v1, _ := m1.Sum(name, match)
		v0, _ := m.m0.Sum(name, match)
		return v1 - v0
	}
	for _, res := range []string{"services", "endpointslices"} {
		c.Lists += d("apiserver_request_total", map[string]string{"verb": "LIST", "resource": res})
		c.WatchLists += d("apiserver_watch_list_duration_seconds_count", map[string]string{"resource": res})
		c.ListsFromCache += d("apiserver_cache_list_total", map[string]string{"resource": res})
		for _, op := range []string{"list", "listWithCount", "listStream"} {
			c.ListsFromEtcd += d("etcd_requests_total", map[string]string{"operation": op, "resource": res})
		}
	}
	c.TooManyRequests = d("apiserver_request_total", map[string]string{"code": "429"})
	c.Rejected = d("apiserver_flowcontrol_rejected_requests_total", nil)
	c.WatchEventBytes = d("apiserver_watch_events_sizes_sum", nil)
	open := func(res string) float64 {
		v, _ := m1.Sum("apiserver_longrunning_requests", map[string]string{"verb": "WATCH", "resource": res})
		return v
	}
	c.NodeWatches = open("nodes")
	c.ProxyWatches = open("services") + open("endpointslices")
	for _, verb := range []string{"POST", "PUT", "PATCH", "DELETE"} {
		c.SliceWrites += d("apiserver_request_total", map[string]string{"verb": verb, "resource": "endpointslices"})
	}
	return c
}

// apiMetrics reads the API server's /metrics.
func (cl *cluster) apiMetrics() (promtext.Scrape, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw, err := cl.client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return promtext.Parse(string(raw)), nil
}

// txBytes is what the control namespace has sent onto the node fabric: its
// bridge's transmitted bytes, read through etcd's process (which lives in
// that namespace for the whole run, unlike the API server).
func (cl *cluster) txBytes() uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", cl.bed.ControlPlanePIDs()[1]))
	if err != nil {
		cl.tb.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != "br0" {
			continue
		}
		if f := strings.Fields(rest); len(f) >= 9 {
			v, _ := strconv.ParseUint(f[8], 10, 64) // receive: 8 fields, then transmit bytes
			return v
		}
	}
	cl.tb.Fatal("no br0 in the control namespace's /proc/net/dev")
	return 0
}

// cpuSeconds is a process's user and system CPU time (0 if it is gone).
func cpuSeconds(pid int) float64 {
	st, _ := procstat.Read(pid)
	return st.CPU()
}
