package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/testutil/netns"
)

// smokeTimeout bounds each wait of the smoke tests: for the proxy's first
// sync, a change reaching the data path, a process to start or stop. The
// same tests run on one emulated CPU (e2e/nodes), where a start of the
// proxy takes seconds; here they take milliseconds.
const smokeTimeout = 90 * time.Second

// smokeProcess is a process of a smoke test: the test binary in one of
// its roles (smoke_roles_test.go), in a network namespace.
type smokeProcess struct {
	name    string
	cmd     *exec.Cmd
	output  *syncBuffer    // standard output and error
	stdin   io.WriteCloser // closing it stops the process
	control *bufio.Reader  // its lines on controlFd
	exited  chan struct{}  // closed once it exited; then err is set
	err     error
}

// startSmokeProcess starts the test binary as role in ns with args. It
// is stopped when the test ends (its standard input closed, then killed
// if it does not exit), and killed by the kernel if the test process
// dies first (Pdeathsig), so that no namespace stays alive through it.
// At the end of a failed test its output is logged.
func startSmokeProcess(t *testing.T, ns *netns.NS, name, role string, env []string, args ...string) *smokeProcess {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &smokeProcess{name: name, output: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command("ip", append([]string{"netns", "exec", ns.Name, exe}, args...)...)
	p.cmd.Env = append(childEnv(role), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.ExtraFiles = []*os.File{w} // controlFd
	p.control = bufio.NewReader(r)
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	w.Close()
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
		r.Close()
	}()
	t.Cleanup(func() {
		p.stop(t)
		if out := p.output.String(); t.Failed() && out != "" {
			t.Logf("%s's output (last 150 lines):\n%s", name, lastLines(out, 150))
		}
	})
	return p
}

// stop closes the process's standard input and waits for it to exit,
// killing it after smokeTimeout. It reports a failure exit status.
func (p *smokeProcess) stop(t *testing.T) {
	t.Helper()
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(smokeTimeout):
		t.Errorf("%s did not stop within %v of its standard input closing: killed", p.name, smokeTimeout)
		p.cmd.Process.Kill()
		<-p.exited
		return
	}
	if p.err != nil {
		t.Errorf("%s: %v", p.name, p.err)
	}
}

// readControl returns the process's next line on the control pipe.
func (p *smokeProcess) readControl(t *testing.T, what string) string {
	t.Helper()
	line := make(chan string, 1)
	go func() {
		s, _ := p.control.ReadString('\n')
		line <- strings.TrimSuffix(s, "\n")
	}()
	select {
	case s := <-line:
		if s == "" {
			<-p.exited
			t.Fatalf("%s exited (%v) before %s:\n%s", p.name, p.err, what, lastLines(p.output.String(), 50))
		}
		return s
	case <-time.After(smokeTimeout):
		t.Fatalf("%s: no %s within %v:\n%s", p.name, what, smokeTimeout, lastLines(p.output.String(), 50))
	}
	return ""
}

// alive fails the test if the process has exited.
func (p *smokeProcess) alive(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("%s exited: %v\n%s", p.name, p.err, lastLines(p.output.String(), 50))
	default:
	}
}

// startEndpoints starts the servers of every endpoint pod.
func (c *smokeCluster) startEndpoints(t *testing.T) {
	t.Helper()
	var procs []*smokeProcess
	for _, h := range []*smokeHost{c.node, c.remote} {
		for _, p := range h.pods {
			if p == c.client {
				continue
			}
			procs = append(procs, startSmokeProcess(t, p.ns, "endpoint "+p.name, roleEndpoint, []string{smokePodEnv + "=" + p.name}))
		}
	}
	for _, p := range procs {
		if s := p.readControl(t, "ready"); s != "ready" {
			t.Fatalf("%s: %q, want ready", p.name, s)
		}
	}
}

// smokeProxy is the proxy process of a test, on the fake API.
type smokeProxy struct {
	*smokeProcess
	api  *smokeAPI
	args []string // its command line
}

// startProxy starts nftproxy in the node's namespace with args, on a fake
// API holding api's objects.
func (c *smokeCluster) startProxy(t *testing.T, api *smokeAPI, args ...string) *smokeProxy {
	t.Helper()
	p := &smokeProxy{smokeProcess: startSmokeProcess(t, c.node.ns, "nftproxy", roleProxy, nil, args...), api: api, args: args}
	p.send(t, api.objects())
	return p
}

// send writes objects to the proxy's fake API.
func (p *smokeProxy) send(t *testing.T, objs []json.RawMessage) {
	t.Helper()
	b, err := json.Marshal(objs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		t.Fatalf("write to %s: %v", p.name, err)
	}
}

// update creates or updates objects in the fake API (and in api, the
// test's copy of its state), as a client of the API server would.
func (p *smokeProxy) update(t *testing.T, objs ...any) {
	t.Helper()
	raw := p.api.put(t, objs...)
	p.send(t, raw)
	if reply := p.readControl(t, "the API's answer"); reply != "ok" {
		t.Fatalf("update of the fake API: %s", reply)
	}
}

// runCommand runs `nftproxy args...` as shipped in ns, with stdin, and
// returns its exit status and standard output; its standard error is
// logged.
func runCommand(t *testing.T, ns *netns.NS, stdin string, args ...string) (int, string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), smokeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns.Name, exe}, args...)...)
	cmd.Env = childEnv(roleCommand)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("nftproxy %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if s := strings.TrimSpace(stderr.String()); s != "" {
		t.Logf("nftproxy %s: standard error:\n%s", strings.Join(args, " "), lastLines(s, 30))
	}
	return cmd.ProcessState.ExitCode(), stdout.String()
}

// childEnv is the environment of a process in role: the test's, with the
// role. Built with the race detector, the test binary waits a second
// when it exits (GORACE's atexit_sleep_ms) unless told otherwise; a
// race still fails the process with exit status 66.
func childEnv(role string) []string {
	env := append(os.Environ(), smokeRoleEnv+"="+role)
	if os.Getenv("GORACE") == "" {
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	return env
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("[%d lines before]", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}
