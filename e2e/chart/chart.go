// Package chart holds what the tests of the Helm chart (deploy/helm/nftproxy)
// share: rendering it with a helm binary and the kustomizations with
// kubectl, reading manifests into objects keyed by kind, namespace and name,
// and the values table of docs/installing.md, made from the chart's
// values.schema.json and values.yaml.
//
// Its own tests (chart_test.go) hold the chart to deploy/; the install,
// upgrade, rollback and uninstall on real kubelets are TestHelm's
// (e2e/conformance, make helm-e2e).
package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// Dir is the chart's directory under the repository's root.
const Dir = "deploy/helm/nftproxy"

// Object is one manifest's object, as JSON decodes it.
type Object map[string]any

// Key names an object: kind, namespace and name.
func (o Object) Key() string {
	meta, _ := o["metadata"].(map[string]any)
	ns, _ := meta["namespace"].(string)
	name, _ := meta["name"].(string)
	kind, _ := o["kind"].(string)
	return kind + " " + ns + "/" + name
}

// Parse reads a stream of YAML documents into objects by key; empty
// documents (a template that rendered nothing) are left out.
func Parse(manifests []byte) (map[string]Object, error) {
	objs := map[string]Object{}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	for {
		var o Object
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, err
		}
		if len(o) == 0 {
			continue
		}
		k := o.Key()
		if _, dup := objs[k]; dup {
			return nil, fmt.Errorf("%s twice", k)
		}
		objs[k] = o
	}
}

// Run runs a tool and returns its standard output; a failure's error holds
// its standard error.
func Run(tool string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s", filepath.Base(tool), strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}

// Template renders the chart at dir with helm as release "nftproxy" in
// kube-system, with args added (--set, -f).
func Template(helm, dir string, args ...string) (map[string]Object, error) {
	out, err := Run(helm, append([]string{"template", "nftproxy", dir, "--namespace", "kube-system"}, args...)...)
	if err != nil {
		return nil, err
	}
	return Parse(out)
}

// Kustomize renders a kustomization directory with kubectl.
func Kustomize(kubectl, dir string) (map[string]Object, error) {
	out, err := Run(kubectl, "kustomize", dir)
	if err != nil {
		return nil, err
	}
	return Parse(out)
}

// Overlay writes into dir a kustomization of base with component added,
// by paths relative to dir: kustomize takes no other.
func Overlay(dir, base, component string) error {
	b, err1 := filepath.Rel(dir, base)
	c, err2 := filepath.Rel(dir, component)
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- %s\ncomponents:\n- %s\n", b, c)
	return os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// Diff says how two sets of objects differ, object by object ("" when
// they are equal): the keys only one has, and for each key both have, the
// first differing path.
func Diff(got, want map[string]Object) string {
	var b strings.Builder
	for _, k := range slices.Sorted(unionKeys(got, want)) {
		g, inGot := got[k]
		w, inWant := want[k]
		switch {
		case !inGot:
			fmt.Fprintf(&b, "%s: missing\n", k)
		case !inWant:
			fmt.Fprintf(&b, "%s: not expected\n", k)
		default:
			if d := diffValue(k, map[string]any(g), map[string]any(w)); d != "" {
				b.WriteString(d + "\n")
			}
		}
	}
	return b.String()
}

// diffValue returns the first path where got and want differ.
func diffValue(path string, got, want any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return fmt.Sprintf("%s: got %s, want %s", path, show(got), show(want))
		}
		for _, k := range slices.Sorted(unionKeys(g, w)) {
			if d := diffValue(path+"."+k, g[k], w[k]); d != "" {
				return d
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return fmt.Sprintf("%s: got %s, want %s", path, show(got), show(want))
		}
		for i := range w {
			if d := diffValue(fmt.Sprintf("%s[%d]", path, i), g[i], w[i]); d != "" {
				return d
			}
		}
		return ""
	default:
		if !reflect.DeepEqual(got, want) {
			return fmt.Sprintf("%s: got %s, want %s", path, show(got), show(want))
		}
		return ""
	}
}

// unionKeys yields each key of a and b once.
func unionKeys[V any](a, b map[string]V) iter.Seq[string] {
	return func(yield func(string) bool) {
		for k := range a {
			if !yield(k) {
				return
			}
		}
		for k := range b {
			if _, in := a[k]; !in && !yield(k) {
				return
			}
		}
	}
}

// jsonText is v as JSON, for the values table.
func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// show is v as JSON cut short, for a message.
func show(v any) string {
	s := jsonText(v)
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// ValuesTable is docs/installing.md's table of the chart's values: one row
// per value of values.schema.json that has a description (an object
// without one is walked into; every leaf must have one), with its type, its
// default from values.yaml and the description.
func ValuesTable(chartDir string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		return "", err
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		return "", fmt.Errorf("values.schema.json: %w", err)
	}
	raw, err = os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		return "", err
	}
	var values map[string]any
	if err := sigsyaml.Unmarshal(raw, &values); err != nil {
		return "", fmt.Errorf("values.yaml: %w", err)
	}
	var b strings.Builder
	b.WriteString("| Value | Type | Default | What it does |\n|---|---|---|---|\n")
	var walk func(path string, s map[string]any, v any) error
	walk = func(path string, s map[string]any, v any) error {
		props, _ := s["properties"].(map[string]any)
		desc, _ := s["description"].(string)
		if len(props) > 0 && desc == "" {
			vm, _ := v.(map[string]any)
			for _, k := range slices.Sorted(maps.Keys(props)) {
				if k == "global" {
					continue
				}
				p := k
				if path != "" {
					p = path + "." + k
				}
				sub, _ := props[k].(map[string]any)
				if err := walk(p, sub, vm[k]); err != nil {
					return err
				}
			}
			return nil
		}
		if desc == "" {
			return fmt.Errorf("values.schema.json: %s has no description", path)
		}
		typ, _ := s["type"].(string)
		if e, ok := s["enum"].([]any); ok {
			var alts []string
			for _, a := range e {
				alts = append(alts, jsonText(a))
			}
			typ = "one of " + strings.Join(alts, ", ")
		}
		def := "`" + jsonText(v) + "`"
		if v == nil {
			def = "–"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", path, strings.ReplaceAll(typ, "|", `\|`), def, strings.ReplaceAll(desc, "|", `\|`))
		return nil
	}
	if err := walk("", schema, values); err != nil {
		return "", err
	}
	return b.String(), nil
}
