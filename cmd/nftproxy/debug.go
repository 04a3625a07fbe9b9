package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/nftproxy/nftproxy/nft"
)

// installDebug serves, with --profiling, nftproxy's debugging commands on
// the metrics server, so that a running proxy answers them without a
// second binary in its pod:
//
//	/debug/nftproxy/dump                      nftproxy dump
//	/debug/nftproxy/diff[?output=json]        nftproxy diff (status 200 either way; the body says)
//	/debug/nftproxy/explain?to=ADDR:PORT[&from=…&iif=…&protocol=…&output=json]
//
// Each runs the command's code with the proxy's own options: dump and diff
// list the objects from the API server once per request, as the commands
// do; explain reads only the kernel.
func installDebug(mux *http.ServeMux, o *options) {
	mux.HandleFunc("/debug/nftproxy/dump", func(w http.ResponseWriter, r *http.Request) {
		debugReply(w, func(out io.Writer) (int, error) {
			return http.StatusOK, runDump(r.Context(), o, dumpOptions{}, environment{stdout: out, stderr: io.Discard})
		})
	})
	mux.HandleFunc("/debug/nftproxy/diff", func(w http.ResponseWriter, r *http.Request) {
		debugReply(w, func(out io.Writer) (int, error) {
			format := r.URL.Query().Get("output")
			if format == "" {
				format = "text"
			}
			if format != "text" && format != "json" {
				return http.StatusBadRequest, fmt.Errorf("output %q: not text or json", format)
			}
			drifts, err := runDiff(r.Context(), o, diffOptions{}, environment{stderr: io.Discard})
			if err != nil {
				return http.StatusInternalServerError, err
			}
			if format == "text" && allEmpty(drifts) {
				_, err := io.WriteString(out, "no differences\n")
				return http.StatusOK, err
			}
			return http.StatusOK, writeDrifts(out, format, drifts)
		})
	})
	mux.HandleFunc("/debug/nftproxy/explain", func(w http.ResponseWriter, r *http.Request) {
		debugReply(w, func(out io.Writer) (int, error) {
			return debugExplain(r.Context(), r.URL.Query(), out)
		})
	})
}

// debugExplain runs explain for the query's parameters, which are the
// command's flags, the destination as "to".
func debugExplain(ctx context.Context, query map[string][]string, out io.Writer) (int, error) {
	var args []string
	for _, name := range []string{"from", "iif", "protocol", "output"} {
		if v := query[name]; len(v) > 0 {
			args = append(args, "--"+name, v[0])
		}
	}
	args = append(args, query["to"]...)
	q, err := parseExplain(args, io.Discard)
	if err != nil {
		return http.StatusBadRequest, err
	}
	ex, err := explain(ctx, q)
	if err != nil {
		return http.StatusInternalServerError, err
	}
	return http.StatusOK, ex.write(out, q.output)
}

func allEmpty(drifts []*nft.Drift) bool {
	for _, d := range drifts {
		if !d.Empty() {
			return false
		}
	}
	return true
}

// debugReply runs a handler into a buffer, so that an error is answered
// with its status and message instead of half a report.
func debugReply(w http.ResponseWriter, handle func(io.Writer) (int, error)) {
	var buf bytes.Buffer
	code, err := handle(&buf)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err != nil {
		if code == http.StatusOK {
			code = http.StatusInternalServerError
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "%v\n", err)
		return
	}
	_, _ = w.Write(buf.Bytes())
}
