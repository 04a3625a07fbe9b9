package main

import (
	"os"
	"strconv"

	"k8s.io/klog/v2"
)

// oomScoreAdjPath is where applyOOMScoreAdj writes; tests replace it.
var oomScoreAdjPath = "/proc/self/oom_score_adj"

// applyOOMScoreAdj sets nftproxy's OOM score adjustment (--oom-score-adj,
// oomScoreAdj; upstream's default -999 makes the kernel kill other
// processes first) when the proxy starts, as upstream does. Failing (an
// unprivileged process cannot lower it) is logged, not fatal, as upstream.
func applyOOMScoreAdj(value int) {
	if err := os.WriteFile(oomScoreAdjPath, []byte(strconv.Itoa(value)), 0o644); err != nil {
		klog.V(2).InfoS("Failed to apply the OOM score adjustment", "value", value, "err", err)
		return
	}
	klog.V(2).InfoS("Applied the OOM score adjustment", "value", value)
}
