package conformance

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// LoadSummary is what e2e/cmd/probe's `load` reports at its end: new
// connections attempted, answered and failed, long-lived ones held and
// broken.
type LoadSummary struct {
	Attempted, Answered, Failed, Held, Broken int
	// Failures are the outcomes of the failed attempts ("refused",
	// "timeout", ...) with their counts.
	Failures map[string]int
}

// Survived is how many long-lived connections lasted the whole run.
func (s LoadSummary) Survived() int { return s.Held - s.Broken }

func (s LoadSummary) String() string {
	return fmt.Sprintf("attempted %d, failed %d, held %d, survived %d", s.Attempted, s.Failed, s.Held, s.Survived())
}

// ParseLoad reads probe load's output (its summary line and the fail lines
// before it).
func ParseLoad(out string) (LoadSummary, error) {
	s := LoadSummary{Failures: map[string]int{}}
	found := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		kv := map[string]string{}
		for _, f := range fields[1:] {
			if k, v, ok := strings.Cut(f, "="); ok {
				kv[k] = v
			}
		}
		switch fields[0] {
		case "fail":
			s.Failures[kv["outcome"]]++
		case "summary":
			for _, f := range []struct {
				key string
				dst *int
			}{{"attempted", &s.Attempted}, {"answered", &s.Answered}, {"failed", &s.Failed}, {"held", &s.Held}, {"broken", &s.Broken}} {
				n, err := strconv.Atoi(kv[f.key])
				if err != nil {
					return s, fmt.Errorf("summary %q: %s: %w", sc.Text(), f.key, err)
				}
				*f.dst = n
			}
			found = true
		}
	}
	if !found {
		return s, fmt.Errorf("no summary line in the load's output:\n%s", out)
	}
	return s, nil
}
