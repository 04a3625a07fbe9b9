package proxyhealth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/configz"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nftproxy/nftproxy/internal/testutil"
	"github.com/nftproxy/nftproxy/metrics"
	"github.com/nftproxy/nftproxy/nft"
)

// body is what external probes read from /healthz and /livez.
type body struct {
	LastUpdated  string                     `json:"lastUpdated"`
	CurrentTime  string                     `json:"currentTime"`
	NodeEligible *bool                      `json:"nodeEligible"`
	Healthy      bool                       `json:"healthy"`
	Status       map[string]json.RawMessage `json:"status"`
}

func TestHealthHandlers(t *testing.T) {
	yes, no := true, false
	tests := []struct {
		name         string
		stuck        bool // an update queued longer than the timeout
		deleteNode   bool
		path         string
		wantCode     int
		wantEligible *bool // nil: field absent
	}{
		{name: "healthz healthy", path: "/healthz", wantCode: 200, wantEligible: &yes},
		{name: "healthz stuck", stuck: true, path: "/healthz", wantCode: 503, wantEligible: &yes},
		{name: "healthz node deleted", deleteNode: true, path: "/healthz", wantCode: 503, wantEligible: &no},
		{name: "livez healthy", path: "/livez", wantCode: 200},
		{name: "livez stuck", stuck: true, path: "/livez", wantCode: 503},
		{name: "livez ignores the node", deleteNode: true, path: "/livez", wantCode: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(t0)
			h := New(testTimeout, clk)
			h.Updated(nft.IPv4)
			if tt.stuck {
				h.QueuedUpdate(nft.IPv4)
			}
			if tt.deleteNode {
				h.SyncNode(nil)
			}
			now := t0.Add(2 * testTimeout)
			clk.SetTime(now)
			counter := map[string]string{"/healthz": "kubeproxy_proxy_healthz_total", "/livez": "kubeproxy_proxy_livez_total"}[tt.path]
			before, _ := served(t, counter, tt.wantCode)

			rec := httptest.NewRecorder()
			HealthMux(h).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))

			if rec.Code != tt.wantCode {
				t.Errorf("code = %d, want %d", rec.Code, tt.wantCode)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var got body
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatalf("body %q: %v", rec.Body.String(), err)
			}
			wantLast := t0 // the last sync; "now" when answering 200, as upstream
			if tt.wantCode == 200 {
				wantLast = now
			}
			want := body{
				LastUpdated:  wantLast.Format(time.RFC3339),
				CurrentTime:  now.Format(time.RFC3339),
				NodeEligible: tt.wantEligible,
				Healthy:      !tt.stuck,
			}
			if got.LastUpdated != want.LastUpdated || got.CurrentTime != want.CurrentTime ||
				got.Healthy != want.Healthy || !sameBoolPtr(got.NodeEligible, want.NodeEligible) {
				t.Errorf("body = %s\nwant lastUpdated %s currentTime %s healthy %v nodeEligible %v",
					rec.Body.String(), want.LastUpdated, want.CurrentTime, want.Healthy, boolPtrText(want.NodeEligible))
			}
			if _, ok := got.Status["IPv4"]; !ok {
				t.Errorf("status lacks IPv4: %s", rec.Body.String())
			}
			if after, _ := served(t, counter, tt.wantCode); after != before+1 {
				t.Errorf("%s went %v → %v, want +1", counter, before, after)
			}
		})
	}
}

func TestMetricsMux(t *testing.T) {
	const metricsBody = "# metrics"
	mux := MetricsMux(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(metricsBody))
	}), false)
	tests := []struct{ path, want, contentType string }{
		{"/proxyMode", "nftables", "text/plain; charset=utf-8"},
		{"/metrics", metricsBody, ""},
		{"/healthz", "ok", "text/plain; charset=utf-8"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tt.path, nil))
			if rec.Code != 200 || rec.Body.String() != tt.want {
				t.Errorf("GET %s = %d %q, want 200 %q", tt.path, rec.Code, rec.Body.String(), tt.want)
			}
			if tt.contentType != "" && rec.Header().Get("Content-Type") != tt.contentType {
				t.Errorf("Content-Type = %q, want %q", rec.Header().Get("Content-Type"), tt.contentType)
			}
		})
	}
}

// TestMetricsMuxConfigz: /configz serves what is registered with
// component-base's configz, as JSON keyed by name, as upstream.
func TestMetricsMuxConfigz(t *testing.T) {
	cz, err := configz.New("test.nftproxy.io")
	if err != nil {
		t.Fatal(err)
	}
	defer configz.Delete("test.nftproxy.io")
	obj := &metav1.Status{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Status"}, Message: "effective"}
	if err := cz.Set(obj); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	MetricsMux(http.NotFoundHandler(), false).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/configz", nil))
	var got map[string]metav1.Status
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 200 {
		t.Fatalf("GET /configz = %d %q: %v", rec.Code, rec.Body, err)
	}
	if got["test.nftproxy.io"].Message != "effective" || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("GET /configz = %q (%s)", rec.Body, rec.Header().Get("Content-Type"))
	}
}

// TestMetricsMuxProfiling: Go's profiles are served only with profiling
// (--profiling), as upstream does.
func TestMetricsMuxProfiling(t *testing.T) {
	for _, profiling := range []bool{false, true} {
		mux := MetricsMux(http.NotFoundHandler(), profiling)
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"} {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
			if got := rec.Code == http.StatusOK; got != profiling {
				t.Errorf("profiling %v: GET %s = %d", profiling, path, rec.Code)
			}
		}
	}
}

// served is the value of name{code} in the metrics registry, and whether
// the registry serves that series.
func served(t *testing.T, name string, code int) (float64, bool) {
	t.Helper()
	return testutil.Served(t, metrics.Registry, name, map[string]string{"code": strconv.Itoa(code)})
}

func sameBoolPtr(a, b *bool) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

func boolPtrText(b *bool) string {
	if b == nil {
		return "absent"
	}
	return strconv.FormatBool(*b)
}

// TestHealthMuxCreatesSeries: both answers' counters exist, at 0, as soon as
// the health server is set up, so that the first 503 is an increase that
// alerts can see.
func TestHealthMuxCreatesSeries(t *testing.T) {
	metrics.ProxyHealthzTotal.Reset()
	metrics.ProxyLivezTotal.Reset()
	HealthMux(New(testTimeout, nil))
	for _, name := range []string{"kubeproxy_proxy_healthz_total", "kubeproxy_proxy_livez_total"} {
		for _, code := range []int{200, 503} {
			if _, ok := served(t, name, code); !ok {
				t.Errorf("%s{code=%q} not served before the first request", name, strconv.Itoa(code))
			}
		}
	}
}
