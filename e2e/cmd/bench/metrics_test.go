package main

import (
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 20; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p := pct(ds, 0.5); p != 10*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := pct(ds, 0.99); p != 20*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := pct(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing = %v", p)
	}
}
