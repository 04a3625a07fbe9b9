package nodes

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Job is what Run runs on a booted node.
type Job struct {
	// Files are copied into the guest before it boots: guest path → host
	// path (a regular file; its permissions are kept). Not under /proc,
	// /sys, /dev, /run or /tmp, which /init mounts over.
	Files map[string]string
	// Script is run by the release's /bin/sh (dash) as root in /root,
	// with the release's nft, ip and conntrack on the PATH (busybox for
	// the other tools), standard input /dev/null, and its
	// standard output and error on Result.Output. Its exit status is
	// Result.ExitCode.
	Script string
	// Timeout bounds the whole run, boot included (default 30 minutes).
	Timeout time.Duration
	// MemoryMiB is the guest's memory (default 1024); the initramfs, Files
	// included, stays in it.
	MemoryMiB int
	// Console, if set, gets the serial console as it arrives (the kernel's
	// warnings, /init's lines), e.g. to follow a run.
	Console io.Writer
}

// Result is what a run of a Job left.
type Result struct {
	// ExitCode is the script's exit status.
	ExitCode int
	// Console is the whole serial console: the kernel's messages of
	// warning level and above, /init's lines and failures.
	Console string
	// Output is the script's standard output and error, byte for byte.
	Output string
	// Duration is the whole run, from starting QEMU until it exited; Boot
	// until /init started, Setup until it had loaded the modules and
	// started the script.
	Duration, Boot, Setup time.Duration
}

const (
	defaultTimeout   = 30 * time.Minute
	defaultMemoryMiB = 1024
)

// mountedOver are the guest directories /init mounts a file system on:
// files put there by the initramfs would be hidden.
var mountedOver = []string{"proc", "sys", "dev", "run", "tmp", "var/run"}

// Run boots the node under QEMU (software emulation, one CPU), runs the
// job's script and returns its exit status and output. It returns an error
// when the guest did not report an exit status: QEMU failed, the kernel
// panicked, the timeout or ctx ended the run (QEMU is killed then); the
// Result holds what the run printed until then. Its temporary files (the
// job's initramfs, the output) are removed before it returns (see
// TempDir for runs that cannot).
func (n *Node) Run(ctx context.Context, job Job) (Result, error) {
	if job.Timeout <= 0 {
		job.Timeout = defaultTimeout
	}
	if job.MemoryMiB <= 0 {
		job.MemoryMiB = defaultMemoryMiB
	}
	tmp, remove, err := TempDir(n.cache)
	if err != nil {
		return Result{}, err
	}
	defer remove()
	nonce := make([]byte, 8)
	rand.Read(nonce)
	marker := "nodes-" + hex.EncodeToString(nonce)
	initrd, output := filepath.Join(tmp, "initrd"), filepath.Join(tmp, "output")
	if err := writeJobInitrd(initrd, n.initramfs, job, hex.EncodeToString(nonce)); err != nil {
		return Result{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, job.Timeout)
	defer cancel()
	cmd, err := n.qemuCommand(ctx, job, initrd, output)
	if err != nil {
		return Result{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Result{}, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := startTracked(cmd); err != nil {
		return Result{}, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	defer untrack(cmd)
	// A guest that reported its exit status but does not power off is
	// stopped after a while, not at the timeout.
	var stopAfterExit *time.Timer
	console := readConsole(stdout, marker, start, job.Console, func() {
		stopAfterExit = time.AfterFunc(powerOffGrace, func() { cmd.Process.Kill() })
	})
	waitErr := cmd.Wait()
	c := <-console
	if stopAfterExit != nil {
		stopAfterExit.Stop()
	}
	res := Result{Duration: time.Since(start), Console: c.text, Boot: c.boot, Setup: c.setup}
	out, err := os.ReadFile(output)
	if err != nil {
		return res, err
	}
	body, complete := bytes.CutSuffix(out, []byte(marker+" end\n"))
	res.Output = string(body)
	switch {
	case ctx.Err() != nil && !c.exited:
		return res, fmt.Errorf("%s: run ended before the job did (%w): console ends with:\n%s", n.Release.Suite, context.Cause(ctx), tail(res.Console, 20))
	case !c.exited:
		return res, fmt.Errorf("%s: the guest stopped without the job's exit status (%v; %s): console ends with:\n%s",
			n.Release.Suite, waitErr, strings.TrimSpace(stderr.String()), tail(res.Console, 20))
	case !complete:
		return res, fmt.Errorf("%s: the job's output (%d bytes) lacks its end marker: lost in transit", n.Release.Suite, len(out))
	}
	res.ExitCode = c.status
	return res, nil
}

// powerOffGrace is how long a guest has to power off after its job ended.
const powerOffGrace = 30 * time.Second

// qemuCommand is the QEMU that boots the node with initrd, its console
// on standard output and the job's output written to output. Every guest
// has one emulated CPU: KVM does not work on the machines we test on (they
// are VMs themselves; docs/nodes.md).
func (n *Node) qemuCommand(ctx context.Context, job Job, initrd, output string) (*exec.Cmd, error) {
	a := n.Release.arch()
	path, err := exec.LookPath(a.QEMU)
	if err != nil {
		return nil, fmt.Errorf("%w (e2e/tools/deps.sh installs %s)", err, a.QEMUPackage)
	}
	args := append([]string{"-accel", "tcg"}, a.Machine...)
	args = append(args, "-smp", "1", "-m", strconv.Itoa(job.MemoryMiB),
		"-kernel", n.vmlinuz, "-initrd", initrd,
		"-append", "console="+a.Console+" panic=-1 quiet",
		"-nographic", "-no-reboot", "-nodefaults", "-no-user-config",
		"-serial", "stdio",
		// The job's output: a serial port of virtio's, which took 50 MB in
		// 2.5 s where a second 16550 serial port moved 0.5 MB/s
		// (docs/nodes.md).
		"-device", "virtio-serial-pci,id=vser",
		"-chardev", "file,id=output,path="+output,
		"-device", "virtserialport,bus=vser.0,chardev=output,name=nodes.output")
	cmd := exec.CommandContext(ctx, path, args...)
	// Its own process group, so that Ctrl-C reaches this process only,
	// which kills QEMU (onSignal); killed too when this process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	return cmd, nil
}

// writeJobInitrd writes the node's base archive and, after it, the job's:
// its files, its script and the run's nonce (init.sh).
func writeJobInitrd(dst, base string, job Job, nonce string) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := os.Open(base)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, b)
	b.Close()
	if err != nil {
		return err
	}
	w := newCPIOWriter(f)
	guests := make([]string, 0, len(job.Files))
	for guest := range job.Files {
		guests = append(guests, guest)
	}
	slices.Sort(guests)
	for _, guest := range guests {
		name, err := cleanGuestPath(guest)
		if err != nil {
			return err
		}
		merged := mergedPath(name)
		for _, d := range mountedOver {
			if merged == d || strings.HasPrefix(merged, d+"/") || name == "init" || strings.HasPrefix(name, "etc/nodes/") {
				return fmt.Errorf("job file %s: /init mounts over it or owns it", guest)
			}
		}
		w.HostFile("/"+merged, job.Files[guest])
	}
	w.Bytes("/etc/nodes/job/nonce", 0o644, []byte(nonce+"\n"))
	w.Bytes("/etc/nodes/job/script", 0o755, []byte(job.Script))
	if err := w.Close(); err != nil {
		return err
	}
	return f.Close()
}

// consoleResult is what readConsole saw.
type consoleResult struct {
	text        string
	boot, setup time.Duration
	exited      bool
	status      int
}

// readConsole collects the console until EOF, timing /init's marked lines
// and reading the exit status from them (calling exited then).
func readConsole(r io.Reader, marker string, start time.Time, tee io.Writer, exited func()) <-chan consoleResult {
	done := make(chan consoleResult, 1)
	go func() {
		var c consoleResult
		var text strings.Builder
		var initAt time.Time
		br := bufio.NewReader(r)
		for {
			line, err := br.ReadString('\n')
			line = strings.ReplaceAll(line, "\r", "")
			text.WriteString(line)
			if tee != nil && line != "" {
				tee.Write([]byte(line))
			}
			// The BIOS's escape sequences may precede /init's first line.
			if i := strings.Index(line, marker+" "); i >= 0 {
				rest := strings.TrimSpace(line[i+len(marker)+1:])
				now := time.Now()
				switch {
				case rest == "init":
					initAt = now
					c.boot = now.Sub(start)
				case rest == "ready" && !initAt.IsZero():
					c.setup = now.Sub(initAt)
				case strings.HasPrefix(rest, "exit "):
					if s, err := strconv.Atoi(strings.TrimPrefix(rest, "exit ")); err == nil && !c.exited {
						c.exited, c.status = true, s
						if exited != nil {
							exited()
						}
					}
				}
			}
			if err != nil {
				break
			}
		}
		c.text = text.String()
		done <- c
	}()
	return done
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// What runs in progress leave until they end, for onSignal: QEMU
// processes, temporary directories.
var live = struct {
	sync.Mutex
	cmds map[*exec.Cmd]bool
	dirs map[string]bool
	once sync.Once
}{cmds: map[*exec.Cmd]bool{}, dirs: map[string]bool{}}

func startTracked(cmd *exec.Cmd) error {
	live.once.Do(onSignal)
	live.Lock()
	defer live.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	live.cmds[cmd] = true
	return nil
}

func untrack(cmd *exec.Cmd) {
	live.Lock()
	delete(live.cmds, cmd)
	live.Unlock()
}

// onSignal kills the runs' QEMU processes and removes the temporary
// directories on SIGINT or SIGTERM (Ctrl-C of go test), then exits:
// without it the test binary would end at once, its deferred clean-ups
// unrun.
func onSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		live.Lock()
		for cmd := range live.cmds {
			cmd.Process.Kill()
			cmd.Process.Wait()
		}
		for dir := range live.dirs {
			os.RemoveAll(dir)
		}
		os.Exit(128 + int(sig.(syscall.Signal)))
	}()
}

// TempDir makes a temporary directory under the cache,
// nodes/tmp/run-<pid>-*, and returns it with the function that removes
// it. Ctrl-C removes it too; those of processes that are gone otherwise
// (killed, or ended by go test's -timeout) go at the next TempDir or Run.
// Run keeps its files there, and so can a test (its test binaries).
func TempDir(cache string) (string, func(), error) {
	live.once.Do(onSignal)
	parent := filepath.Join(cache, "nodes", "tmp")
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return "", nil, err
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		return "", nil, err
	}
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "run-%d-", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(filepath.Join(parent, e.Name()))
		}
	}
	dir, err := os.MkdirTemp(parent, fmt.Sprintf("run-%d-", os.Getpid()))
	if err != nil {
		return "", nil, err
	}
	live.Lock()
	live.dirs[dir] = true
	live.Unlock()
	return dir, func() {
		live.Lock()
		delete(live.dirs, dir)
		live.Unlock()
		os.RemoveAll(dir)
	}, nil
}
