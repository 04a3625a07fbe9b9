package testbed

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// bedEnv marks every process a bed starts with the bed's prefix, so Sweep can find
// leftovers by their environment even after their namespace is gone.
const bedEnv = "NFTPROXY_E2E_BED"

// Process is a long-running program started in a namespace by Netns.Start.
type Process struct {
	// Args is the command line (without the `ip netns exec NS` wrapper).
	Args []string
	// LogPath is the file receiving the process's standard output and error.
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// startProcess starts args in namespace ns in its own process group (so Kill reaches its
// children too) with SIGKILL as parent-death signal (so it dies with the test process even
// when nothing else gets to clean up).
func (b *Bed) startProcess(ns string, args []string) (*Process, error) {
	return b.startCommand(ns, []string{"ip", "netns", "exec", ns}, args)
}

// startCommand is startProcess with the command line wrapper + args (wrapper may be
// empty), its log named after ns and args.
func (b *Bed) startCommand(ns string, wrapper, args []string) (*Process, error) {
	if len(args) == 0 {
		return nil, fmt.Errorf("no command")
	}
	b.mu.Lock()
	b.procSeq++
	logPath := filepath.Join(b.logDir, fmt.Sprintf("%s-%s-%d.log", strings.TrimPrefix(ns, b.Prefix+"-"), filepath.Base(args[0]), b.procSeq))
	b.mu.Unlock()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	argv := append(slices.Clone(wrapper), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = b.processEnv()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Process{Args: args, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	b.mu.Lock()
	b.procs = append(b.procs, p)
	b.mu.Unlock()
	return p, nil
}

// processEnv is the environment of every process a bed starts.
func (b *Bed) processEnv() []string {
	return append(os.Environ(), bedEnv+"="+b.Prefix)
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err is the process's exit status once Done is closed.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Pid is the process id (also its process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process's whole process group.
func (p *Process) Signal(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Stop asks the process group to exit with SIGTERM and kills it after grace.
func (p *Process) Stop(grace time.Duration) {
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// Kill kills the process group with SIGKILL and waits for the process to exit.
func (p *Process) Kill() {
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Log returns everything the process has written so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// WaitForLog waits until the process's log contains substr. It returns an error (with the
// log's tail) when ctx ends or the process exits first.
func (p *Process) WaitForLog(ctx context.Context, substr string) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		log, _ := os.ReadFile(p.LogPath)
		if bytes.Contains(log, []byte(substr)) {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited (%v) before logging %q:\n%s", p.Args[0], p.err, substr, tail(string(log), 20))
		case <-ctx.Done():
			return fmt.Errorf("%s did not log %q: %w:\n%s", p.Args[0], substr, ctx.Err(), tail(string(log), 20))
		case <-tick.C:
		}
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
