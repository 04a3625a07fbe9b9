package testbed

// TB is the part of testing.TB a bed uses. *testing.T and *testing.B
// satisfy it; so does a program's own implementation (see e2e/cmd/demo),
// which is how the demo runs a bed outside `go test`.
type TB interface {
	Helper()
	Log(args ...any)
	Logf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	Failed() bool
}
