// Package testutil holds what the unit tests of several packages share, so
// that they do it the same way: Poll and Eventually, one limit for every
// wait on something running beside the test; Value and Served, a metric's
// value as a scrape reads it. Its own packages hold what only some tests
// need: netns (a kernel test's network namespace), kubebin (the checkout,
// its pinned Kubernetes releases and their binaries), liveheap (the live
// heap, which e2e/cmd/bench reads too) and benchrules (the bench's cluster
// as the Editor of a full sync, for the benchmarks of proxier/ruleset and
// nft/nftnl).
//
// Only tests (and e2e/, which is tests) import these packages.
package testutil
