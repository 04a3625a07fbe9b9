package testbed

import (
	"fmt"
	"os"
)

// Main runs fn with a TB for programs (the demo, the benchmark) rather than
// tests: Log prints to standard output, Fatal prints to standard error and
// stops fn, cleanups run in reverse order when fn returns or stops. It
// returns the exit code: 1 if fn failed. Ctrl-C is handled by the bed itself
// (see cleanup.go).
func Main(fn func(tb TB)) int {
	p := &programTB{}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stopProgram); !ok {
					p.runCleanups()
					panic(r)
				}
			}
		}()
		fn(p)
	}()
	p.runCleanups()
	if p.failed {
		return 1
	}
	return 0
}

type programTB struct {
	cleanups []func()
	failed   bool
}

type stopProgram struct{}

func (p *programTB) Helper()                           {}
func (p *programTB) Log(args ...any)                   { fmt.Println(args...) }
func (p *programTB) Logf(format string, args ...any)   { fmt.Printf(format+"\n", args...) }
func (p *programTB) Fatalf(format string, args ...any) { p.Fatal(fmt.Sprintf(format, args...)) }
func (p *programTB) Cleanup(f func())                  { p.cleanups = append(p.cleanups, f) }
func (p *programTB) Failed() bool                      { return p.failed }

func (p *programTB) Fatal(args ...any) {
	p.failed = true
	fmt.Fprintln(os.Stderr, append([]any{"FATAL:"}, args...)...)
	panic(stopProgram{})
}

func (p *programTB) runCleanups() {
	for i := len(p.cleanups) - 1; i >= 0; i-- {
		p.cleanups[i]()
	}
	p.cleanups = nil
}
