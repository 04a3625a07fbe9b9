package testbed

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// runcRoot is runc's state directory (runc --root) for the containers of beds: apart
// from runc's default, so that Sweep only ever sees containers a bed made.
const runcRoot = "/run/nftproxy-e2e-runc"

// Container is an OCI container a bed runs with runc (Node.RunContainer).
type Container struct {
	// Process is `runc run` in the foreground: its log holds the container's standard
	// output and error; Stop's SIGTERM is forwarded to the container's process.
	*Process
	// ID is the container's runc id: the bed's prefix, the node's name, the name given.
	ID string
	// Bundle is the bundle directory holding config.json.
	Bundle string
}

// containerName is what RunContainer accepts as a name (runc ids allow a little more).
var containerName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// RunContainer runs the container spec describes with runc, in the foreground, and
// returns at once. spec is used as given (its network namespace is the caller's
// choice: the node's path for a hostNetwork pod) except that its cgroup is named
// after the container's id. The container is deleted (runc delete --force: its
// processes killed, its cgroups removed) when the bed is cleaned up, on Ctrl-C too,
// and by Sweep after a crash. RunContainer fails the test on error; call it from the
// test goroutine.
func (n *Node) RunContainer(name string, spec *specs.Spec) *Container {
	b := n.bed
	b.t.Helper()
	c, err := b.runContainer(n, name, spec)
	if err != nil {
		b.t.Fatalf("run container %s on %s: %v", name, n.Name, err)
	}
	return c
}

func (b *Bed) runContainer(n *Node, name string, spec *specs.Spec) (*Container, error) {
	if !containerName.MatchString(name) {
		return nil, fmt.Errorf("container name %q: lower-case letters, digits and '-' only", name)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return nil, fmt.Errorf("needs runc (Debian package runc; e2e/tools/deps.sh installs it): %w", err)
	}
	id := b.Prefix + "-" + n.Name + "-" + name
	bundle := filepath.Join(b.Dir, "containers", id)
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return nil, err
	}
	if spec.Linux == nil || spec.Root == nil || spec.Process == nil {
		return nil, fmt.Errorf("the spec needs process, root and linux")
	}
	s := *spec
	linux := *s.Linux
	linux.CgroupsPath = "/" + id // runc deletes it with the container
	s.Linux = &linux
	config, err := json.MarshalIndent(&s, "", "\t")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), config, 0o600); err != nil {
		return nil, err
	}
	// Recorded before runc starts, so that a cleanup racing with the start deletes it.
	b.mu.Lock()
	b.containers = append(b.containers, id)
	b.mu.Unlock()
	// runc runs in the root namespaces: it enters the namespaces the spec names.
	p, err := b.startCommand(n.NS, nil, []string{"runc", "--root", runcRoot, "run", "--bundle", bundle, id})
	if err != nil {
		return nil, err
	}
	return &Container{Process: p, ID: id, Bundle: bundle}, nil
}

// State is `runc state`: the container's status ("running", …) and the host PID of
// its first process.
func (c *Container) State() (status string, pid int, err error) {
	out, err := exec.Command("runc", "--root", runcRoot, "state", c.ID).Output()
	if err != nil {
		return "", 0, fmt.Errorf("runc state %s: %w", c.ID, exitMessage(err))
	}
	var st specs.State
	if err := json.Unmarshal(out, &st); err != nil {
		return "", 0, fmt.Errorf("runc state %s: %w", c.ID, err)
	}
	return string(st.Status), st.Pid, nil
}

// deleteContainer kills a container's processes and removes its state and cgroups.
// A container that does not exist (never started, or gone) is not an error.
func deleteContainer(id string) error {
	out, err := exec.Command("runc", "--root", runcRoot, "delete", "--force", id).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "does not exist") {
		return fmt.Errorf("runc delete --force %s: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// runcContainers lists the ids of containers in runcRoot.
func runcContainers() []string {
	entries, _ := os.ReadDir(runcRoot)
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

func exitMessage(err error) error {
	if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}
