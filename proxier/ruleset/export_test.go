package ruleset

// TestConfig is testConfig for the benchmarks of the external test package
// (editor_bench_test.go), which build their Editor with
// internal/testutil/benchrules: that package imports this one, so only an
// external test can use it.
var TestConfig = testConfig
