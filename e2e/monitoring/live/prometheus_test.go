package live

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// promAddr is where Prometheus listens: loopback of the bed's control
// namespace, which nothing outside the bed reaches.
const promAddr = "127.0.0.1:9090"

// prometheus is a Prometheus server running in a bed's control namespace.
type prometheus struct {
	ns      testbed.Netns
	proc    *testbed.Process
	started time.Time
}

// startPrometheus runs prometheus in the bed's control namespace, scraping
// target every second as job kube-proxy and evaluating rules (a rule
// file) every second, with its data in the bed's directory (removed with
// the bed; the bed kills the process on every exit path).
func startPrometheus(t *testing.T, bed *testbed.Bed, bin, target string, rules []byte) *prometheus {
	dir := filepath.Join(bed.Dir, "prometheus")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := yaml.Marshal(map[string]any{
		"global":     map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
		"rule_files": []string{"rules.yaml"},
		"scrape_configs": []any{map[string]any{
			"job_name":       "kube-proxy",
			"static_configs": []any{map[string]any{"targets": []string{target}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"prometheus.yml": cfg, "rules.yaml": rules} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p := &prometheus{ns: bed.Ctl, started: time.Now()}
	p.proc = bed.Ctl.Start(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promAddr,
		"--storage.tsdb.retention.time=1h")
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := p.ns.HTTPGet(ctx, "http://"+promAddr+"/-/ready")
		cancel()
		if err == nil {
			return p
		}
		select {
		case <-p.proc.Done():
			t.Fatalf("prometheus exited: %v\n%s", p.proc.Err(), p.proc.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 30s: %v\n%s", err, p.proc.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// api calls Prometheus's HTTP API and decodes its data into out.
func (p *prometheus) api(path string, params url.Values, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := p.ns.HTTPGet(ctx, "http://"+promAddr+path+"?"+params.Encode())
	var resp struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if jerr := json.Unmarshal([]byte(body), &resp); jerr != nil {
		if err != nil {
			return err
		}
		return fmt.Errorf("%s: %w", path, jerr)
	}
	if resp.Status != "success" {
		return fmt.Errorf("%s: %s", path, resp.Error)
	}
	return json.Unmarshal(resp.Data, out)
}

// sample is one series of an instant query's vector.
type sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"` // time, value as a string
}

// float is the sample's value ("NaN" and "+Inf" included).
func (s sample) float() float64 {
	str, _ := s.Value[1].(string)
	f, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// query evaluates expr now.
func (p *prometheus) query(expr string) ([]sample, error) {
	var data struct {
		ResultType string   `json:"resultType"`
		Result     []sample `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %s, want vector", expr, data.ResultType)
	}
	return data.Result, nil
}

// finite counts the samples with a finite value.
func finite(samples []sample) int {
	n := 0
	for _, s := range samples {
		if f := s.float(); !math.IsNaN(f) && !math.IsInf(f, 0) {
			n++
		}
	}
	return n
}

// labelValues lists the values of label on the series selector matched
// since Prometheus started: Grafana's label_values(selector, label).
func (p *prometheus) labelValues(selector, label string) ([]string, error) {
	var series []map[string]string
	params := url.Values{"match[]": {selector},
		"start": {strconv.FormatInt(p.started.Unix(), 10)}, "end": {strconv.FormatInt(time.Now().Unix()+1, 10)}}
	if err := p.api("/api/v1/series", params, &series); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var values []string
	for _, s := range series {
		if v, ok := s[label]; ok && !seen[v] {
			seen[v] = true
			values = append(values, v)
		}
	}
	return values, nil
}

// window is a PromQL range covering everything since Prometheus started,
// what $__rate_interval stands for in the dashboard's queries here: the
// test's changes are a few per second over a minute, not a steady rate.
func (p *prometheus) window() string {
	return fmt.Sprintf("%ds", int(time.Since(p.started).Seconds())+5)
}

// rule is a rule as /api/v1/rules reports it.
type rule struct {
	Name      string `json:"name"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
	State     string `json:"state"`
}

func (p *prometheus) rules() ([]rule, error) {
	var data struct {
		Groups []struct {
			Rules []rule `json:"rules"`
		} `json:"groups"`
	}
	if err := p.api("/api/v1/rules", nil, &data); err != nil {
		return nil, err
	}
	var out []rule
	for _, g := range data.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}
