// Command benchplot draws the results of one `make bench` run: it reads
// the JSON documents e2e/cmd/bench --json wrote (one per number of
// Services) and writes SVG figures into a directory (docs/bench):
//
//   - latency.svg: single-change latency in the data path, idle and under
//     churn, both proxies side by side, one row per number of Services
//     (empirical CDFs on a log time axis);
//   - cold-start.svg, change-cost.svg, peak-rss.svg: start → rules
//     programmed, the cost of a single change, and peak RSS against the
//     number of Services.
//
// It is a module of its own so that gonum.org/v1/plot stays out of
// nftproxy's dependencies.
//
// Usage:
//
//	go run . --out ../../docs/bench ../../docs/bench/data   # files, or directories of *.json
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/nftproxy/nftproxy/e2e/benchdata"
)

func main() {
	out := flag.String("out", ".", "directory the SVG files are written into")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: benchplot [--out DIR] FILE.json|DIR...\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	written, err := run(*out, flag.Args())
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchplot: %v\n", err)
		os.Exit(1)
	}
	for _, f := range written {
		fmt.Println(f)
	}
}

// run reads the documents named by args and writes every figure into
// out; it returns the files written.
func run(out string, args []string) ([]string, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("no JSON files or directories given")
	}
	runs, err := load(args)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	var written []string
	for _, f := range figures(runs) {
		path := filepath.Join(out, f.file)
		if err := f.save(path); err != nil {
			return written, fmt.Errorf("%s: %w", path, err)
		}
		written = append(written, path)
	}
	return written, nil
}

// load reads the documents, ordered by number of Services. Each size
// may appear once: the figures show one run.
func load(args []string) ([]*benchdata.Run, error) {
	var files []string
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, a)
			continue
		}
		m, err := filepath.Glob(filepath.Join(a, "*.json"))
		if err != nil {
			return nil, err
		}
		files = append(files, m...)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.json in %v", args)
	}
	var runs []*benchdata.Run
	from := map[int]string{}
	for _, f := range files {
		r, err := benchdata.Read(f)
		if err != nil {
			return nil, err
		}
		if len(r.Proxies) == 0 {
			return nil, fmt.Errorf("%s: no proxy's results", f)
		}
		if prev, ok := from[r.Config.Services]; ok {
			return nil, fmt.Errorf("%s and %s are both runs of %d Services: give the files of one run", prev, f, r.Config.Services)
		}
		from[r.Config.Services] = f
		runs = append(runs, r)
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].Config.Services < runs[j].Config.Services })
	return runs, nil
}
