package conformance

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// DetectMachine finds what this machine lacks of Need: the kernel's SCTP
// (SCTPProblem) and iperf 2.2 in the agnhost image, whose Debian packages
// e2e/cmd/testimages lists in packages (name and version a line).
func DetectMachine(packages string) (Machine, error) {
	m := Machine{Lacks: map[Need]string{}}
	if p := SCTPProblem(); p != "" {
		m.Lacks[NeedSCTP] = p
	}
	version, err := packageVersion(packages, "iperf")
	if err != nil {
		return Machine{}, err
	}
	if p := IperfProblem(version); p != "" {
		m.Lacks[NeedIperf22] = p
	}
	return m, nil
}

// SCTPProblem says why this kernel cannot make an SCTP socket, or "" when
// it can: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails with
// EPROTONOSUPPORT on a kernel without CONFIG_IP_SCTP (and loads sctp.ko
// where it is a module, as a pod's first SCTP socket would).
func SCTPProblem() string {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, unix.IPPROTO_SCTP)
	if err != nil {
		return fmt.Sprintf("socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): %v", err)
	}
	unix.Close(fd)
	return ""
}

// IperfProblem says why iperf of Debian version v cannot write the report
// the suite parses (iperf 2.2's 17 CSV fields; 2.1 writes 9), or "".
func IperfProblem(v string) string {
	upstream := v
	if _, after, ok := strings.Cut(upstream, ":"); ok { // epoch
		upstream = after
	}
	upstream, _, _ = strings.Cut(upstream, "+")
	upstream, _, _ = strings.Cut(upstream, "-")
	parts := strings.SplitN(upstream, ".", 3)
	major, err1 := strconv.Atoi(parts[0])
	minor := 0
	var err2 error
	if len(parts) > 1 {
		minor, err2 = strconv.Atoi(parts[1])
	}
	if err1 != nil || err2 != nil {
		return fmt.Sprintf("cannot read iperf version %q", v)
	}
	if major > 2 || (major == 2 && minor >= 2) {
		return ""
	}
	return fmt.Sprintf("our agnhost has Debian's iperf %s, whose CSV has 9 fields", v)
}

// packageVersion reads the version of package name from a packages list.
func packageVersion(path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == name {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s: no package %s", path, name)
}
