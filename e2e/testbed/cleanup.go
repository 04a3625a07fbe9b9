package testbed

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nftproxy/nftproxy/e2e/testbed/cgroupfs"
)

// ownerDir holds one file per live bed, named after its prefix, recording the test process
// that owns it ("PID STARTTIME"). It is on tmpfs, like /run/netns, so both vanish together
// at reboot.
const ownerDir = "/run/nftproxy-e2e"

// prefixPattern matches bed prefixes at the start of namespace names ("nfp1a2b3-ctl").
var prefixPattern = regexp.MustCompile(`^(nfp[0-9a-f]{5})-`)

// beds is every bed of this process that is not cleaned up yet, for the signal handler.
var beds struct {
	sync.Mutex
	live        map[*Bed]struct{}
	handlerOnce sync.Once
}

// register adds b to the live beds and installs the SIGINT/SIGTERM handler once.
// Ctrl-C during `go test` delivers SIGINT to the test binary; without the handler it
// would die at once and leave namespaces, etcd and kube-apiserver behind.
func register(b *Bed) {
	beds.Lock()
	defer beds.Unlock()
	if beds.live == nil {
		beds.live = map[*Bed]struct{}{}
	}
	beds.live[b] = struct{}{}
	beds.handlerOnce.Do(func() {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		go func() {
			sig := <-sigs
			fmt.Fprintf(os.Stderr, "testbed: %v: cleaning up test beds\n", sig)
			beds.Lock()
			live := make([]*Bed, 0, len(beds.live))
			for b := range beds.live {
				live = append(live, b)
			}
			beds.Unlock()
			for _, b := range live {
				b.cleanup(false)
			}
			os.Exit(128 + int(sig.(syscall.Signal)))
		}()
	})
}

func unregister(b *Bed) {
	beds.Lock()
	delete(beds.live, b)
	beds.Unlock()
}

// writeOwner records this process as the owner of prefix. It fails with os.ErrExist if
// another bed already owns prefix, which makes prefixes unique across test processes.
func writeOwner(prefix string) error {
	if err := os.MkdirAll(ownerDir, 0o755); err != nil {
		return err
	}
	start, err := processStartTime(os.Getpid())
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(ownerDir, prefix), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%d %s\n", os.Getpid(), start)
	return errors.Join(err, f.Close())
}

// ownerAlive reports whether the process recorded as owner of prefix still runs. The
// start time guards against a recycled PID.
func ownerAlive(prefix string) bool {
	b, err := os.ReadFile(filepath.Join(ownerDir, prefix))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return false
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil {
		return false
	}
	start, err := processStartTime(pid)
	return err == nil && start == f[1]
}

// processStartTime is field 22 of /proc/PID/stat (start time in clock ticks since boot).
func processStartTime(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	// The command name (field 2) may contain spaces; fields after it are plain.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return f[19], nil
}

// Sweep removes what beds of crashed test processes left behind: runc containers whose
// id starts with a dead bed's prefix, processes carrying a dead bed's marker in their
// environment, processes inside a dead bed's namespaces, the namespaces themselves
// (names starting with "nfp" + 5 hex digits + "-"), cgroups named like them (a
// kubelet's pod parent, e2e/kubenode), working directories in os.TempDir() and owner
// files. Beds whose owning process still runs are left alone, so Sweep is safe while
// other tests run. With force it also removes beds of live owners. It returns what it
// removed, one description per item.
func Sweep(force bool) ([]string, error) {
	var removed []string
	var errs []error
	dead := func(prefix string) bool { return force || !ownerAlive(prefix) }

	// Containers first (runc kills their processes and removes their cgroups), then
	// processes: a namespace cannot be freed while a process still uses it.
	for _, id := range runcContainers() {
		m := prefixPattern.FindStringSubmatch(id)
		if m == nil || !dead(m[1]) {
			continue
		}
		if err := deleteContainer(id); err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, "container "+id)
		}
	}
	for _, pid := range markedProcesses() {
		if pid.prefix != "" && dead(pid.prefix) && syscall.Kill(pid.pid, syscall.SIGKILL) == nil {
			removed = append(removed, fmt.Sprintf("process %d (bed %s)", pid.pid, pid.prefix))
		}
	}
	entries, err := os.ReadDir(netnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	prefixes := map[string]bool{}
	for _, e := range entries {
		m := prefixPattern.FindStringSubmatch(e.Name())
		if m == nil || !dead(m[1]) {
			continue
		}
		prefixes[m[1]] = true
		for _, pid := range netnsPids(e.Name()) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				removed = append(removed, fmt.Sprintf("process %d (in netns %s)", pid, e.Name()))
			}
		}
		if err := deleteNetns(e.Name()); err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, "netns "+e.Name())
		}
	}
	// Cgroups named after a bed's node namespaces: the pods' parent of a kubelet
	// (e2e/kubenode). Processes in them are killed first.
	for _, name := range cgroupfs.Names("nfp?????-*") {
		if m := prefixPattern.FindStringSubmatch(name); m != nil && dead(m[1]) {
			if err := cgroupfs.Remove(name, 5*time.Second); err != nil {
				errs = append(errs, err)
			} else {
				removed = append(removed, "cgroup "+name)
			}
		}
	}
	// Working directories (os.MkdirTemp(prefix + "-")): certificates, etcd data, logs.
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "nfp?????-*"))
	for _, d := range dirs {
		if m := prefixPattern.FindStringSubmatch(filepath.Base(d)); m != nil && dead(m[1]) {
			if err := os.RemoveAll(d); err == nil {
				removed = append(removed, "dir "+d)
			}
		}
	}
	owners, _ := os.ReadDir(ownerDir)
	for _, o := range owners {
		if prefixes[o.Name()] || dead(o.Name()) {
			os.Remove(filepath.Join(ownerDir, o.Name()))
		}
	}
	return removed, errors.Join(errs...)
}

type markedPid struct {
	pid    int
	prefix string
}

// markedProcesses lists processes whose environment carries bedEnv.
func markedProcesses() []markedPid {
	var out []markedPid
	dirs, _ := os.ReadDir("/proc")
	marker := []byte(bedEnv + "=")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		if err != nil {
			continue
		}
		for kv := range bytes.SplitSeq(env, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, marker); ok {
				out = append(out, markedPid{pid: pid, prefix: string(v)})
			}
		}
	}
	return out
}

// netnsPids lists the processes running in a named namespace.
func netnsPids(ns string) []int {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func deleteNetns(ns string) error {
	if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns delete %s: %w: %s", ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}
