package main

import (
	"fmt"
	"slices"
	"strings"
)

// basePackages are the Debian packages of the layer the Debian-based images
// share (agnhost, glibc-dns-testing, nginx, kube-proxy), with their
// dependencies. What the suite runs in them (test/e2e/network, v1.37):
// sh -c scripts with dig, getent, seq and test (DNS tests), curl, nc -v -t/-u,
// nslookup, wget (wgetWrapper), ip, socat and
// iperf (2, for the [Feature:Networking-Performance] test; agnhost's
// Dockerfile installs them); nginx for the nginx image; nft for
// kube-proxy's nftables mode (knftables runs `nft` for every transaction);
// hostname (the DNS hostname tests run it); iptables and conntrack for
// distroless-iptables (the CLOSE_WAIT test reads conntrack entries with it).
var basePackages = []string{
	"bash", "dash", "coreutils", "grep", "sed", "libc-bin",
	"bind9-dnsutils", "curl", "netcat-openbsd", "iproute2", "socat", "procps", "iperf", "wget",
	"hostname", "busybox-static", "nginx-light", "nftables", "iptables", "conntrack",
}

// alternatives are the links update-alternatives would make in a
// maintainer script, which never runs here.
var alternatives = map[string]string{
	"/usr/bin/nc":     "nc.openbsd",
	"/usr/bin/netcat": "nc.openbsd",
	"/usr/bin/awk":    "mawk",
	// Debian's default, the nf_tables backend: what the suite and flanneld
	// run as iptables.
	"/usr/sbin/iptables":          "iptables-nft",
	"/usr/sbin/iptables-save":     "iptables-nft-save",
	"/usr/sbin/iptables-restore":  "iptables-nft-restore",
	"/usr/sbin/ip6tables":         "ip6tables-nft",
	"/usr/sbin/ip6tables-save":    "ip6tables-nft-save",
	"/usr/sbin/ip6tables-restore": "ip6tables-nft-restore",
}

// wgetWrapper is agnhost's /usr/local/bin/wget (first on the PATH): GNU
// wget, trying once as busybox's wget in upstream's Alpine image does (GNU
// wget tries 20 times on a timeout). Debian's busybox 1.35 wget crashes on
// -T, which the suite passes ("wget -T 5 -qO- ..."; the segmentation fault
// failed a Services test with both proxies).
const wgetWrapper = "#!/bin/sh\nexec /usr/bin/wget --tries=1 \"$@\"\n"

// Users and groups of the images: Debian's base ones the packages expect
// (root, www-data for nginx, nobody) and agnhost's user 1000 and group 50000
// (upstream's Dockerfile adds them; security context tests use them).
const (
	etcPasswd = `root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`
	etcGroup = `root:x:0:
daemon:x:1:
tty:x:5:
www-data:x:33:
user-defined-in-image:x:1000:
group-defined-in-image:x:50000:user-defined-in-image
nogroup:x:65534:
`
	// getent hosts (the /etc/hosts test) reads it.
	etcNsswitch = `passwd: files
group: files
shadow: files
hosts: files dns
networks: files
protocols: files
services: files
`
	// nginxConf serves /usr/share/nginx/html on port 80 in the foreground,
	// logging to the container's output, with its temporary files in /tmp:
	// what the suite needs of upstream's nginx image (a pod that runs and
	// answers on 80).
	nginxConf = `user www-data;
worker_processes 1;
pid /tmp/nginx.pid;
error_log stderr;
events { worker_connections 256; }
http {
	access_log /dev/stdout;
	client_body_temp_path /tmp/client_body;
	proxy_temp_path /tmp/proxy;
	fastcgi_temp_path /tmp/fastcgi;
	uwsgi_temp_path /tmp/uwsgi;
	scgi_temp_path /tmp/scgi;
	server {
		listen 80 default_server;
		listen [::]:80 default_server;
		root /usr/share/nginx/html;
	}
}
`
)

// addBaseFiles adds what a root file system has besides its packages'
// files: users, name service configuration, /tmp.
func addBaseFiles(t *Tree) {
	t.AddFile("/etc/passwd", 0o644, []byte(etcPasswd))
	t.AddFile("/etc/group", 0o644, []byte(etcGroup))
	t.AddFile("/etc/nsswitch.conf", 0o644, []byte(etcNsswitch))
	t.AddDir("/tmp", 0o1777)
	t.AddDir("/var/tmp", 0o1777)
	t.AddDir("/root", 0o700)
	t.AddDir("/run", 0o755)
}

// addAlternatives adds the links of alternatives.
func addAlternatives(t *Tree) {
	for link, target := range alternatives {
		t.AddSymlink(link, target)
	}
}

// Image kinds: which image a name belongs to.
const (
	kindAgnhost    = "agnhost"
	kindDNSTest    = "glibc-dns-testing"
	kindNginx      = "nginx"
	kindBusybox    = "busybox"
	kindPause      = "pause"
	kindCoreDNS    = "coredns"
	kindKubeProxy  = "kube-proxy"
	kindProbe      = "probe"
	kindIptables   = "distroless-iptables"
	kindIssue74839 = "regression-issue-74839"
	kindFlannel    = "flannel"
)

// flannelRepo is the repository of our flannel image (--flanneld): not
// flannel's own name, since it is not flannel's image.
const flannelRepo = "docker.io/nftproxy-e2e/flannel"

// e2eRepos are the repositories of test/utils/image/manifest.go we build, by
// kind; every tag the suite lists for one of them names the same image.
var e2eRepos = map[string]string{
	"registry.k8s.io/e2e-test-images/agnhost":                kindAgnhost,
	"registry.k8s.io/e2e-test-images/glibc-dns-testing":      kindDNSTest,
	"registry.k8s.io/e2e-test-images/nginx":                  kindNginx,
	"registry.k8s.io/e2e-test-images/busybox":                kindBusybox,
	"registry.k8s.io/pause":                                  kindPause,
	"registry.k8s.io/build-image/distroless-iptables":        kindIptables,
	"registry.k8s.io/e2e-test-images/regression-issue-74839": kindIssue74839,
}

// kubeadmRepos are the repositories of `kubeadm config images list` we build.
var kubeadmRepos = map[string]string{
	"registry.k8s.io/kube-proxy":      kindKubeProxy,
	"registry.k8s.io/coredns/coredns": kindCoreDNS,
	"registry.k8s.io/pause":           kindPause,
}

// fixedNames are names of ours: the sandbox image containerd is configured
// with (e2e/kubenode's PauseImage) and the disruption test's load generator.
var fixedNames = map[string][]string{
	kindPause: {"docker.io/nftproxy-e2e/pause:1"},
	kindProbe: {"docker.io/nftproxy-e2e/probe:1"},
}

// pickNames maps each image kind to its names: those of e2eList (what
// `e2e.test --list-images` prints) and kubeadmList (`kubeadm config images
// list`) whose repository we build, and fixedNames. Other names are
// ignored. Every kind must get a name.
func pickNames(e2eList, kubeadmList []string) (map[string][]string, error) {
	names := map[string][]string{}
	add := func(list []string, repos map[string]string, from string) error {
		found := map[string]bool{}
		for _, line := range list {
			n := strings.TrimSpace(line)
			if n == "" {
				continue
			}
			i := strings.LastIndex(n, ":")
			if i < 0 || strings.Contains(n[i:], "/") {
				continue // no tag
			}
			if kind, ok := repos[n[:i]]; ok {
				found[kind] = true
				if !slices.Contains(names[kind], n) {
					names[kind] = append(names[kind], n)
				}
			}
		}
		for _, kind := range repos {
			if !found[kind] {
				return fmt.Errorf("%s names no %s image", from, kind)
			}
		}
		return nil
	}
	if err := add(e2eList, e2eRepos, "e2e.test --list-images"); err != nil {
		return nil, err
	}
	if err := add(kubeadmList, kubeadmRepos, "kubeadm config images list"); err != nil {
		return nil, err
	}
	for kind, fixed := range fixedNames {
		names[kind] = append(names[kind], fixed...)
	}
	for _, n := range names {
		slices.Sort(n)
	}
	return names, nil
}

// tagOf returns the tag of the first name of repo among names ("" if none).
func tagOf(names []string, repo string) string {
	for _, n := range names {
		if r, tag, ok := strings.Cut(n, repo+":"); ok && r == "" {
			return tag
		}
	}
	return ""
}
