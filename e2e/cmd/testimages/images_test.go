package main

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

// e2eListImages is part of `e2e.test --list-images` (v1.37.2).
const e2eListImages = `registry.k8s.io/e2e-test-images/agnhost:2.55
registry.k8s.io/e2e-test-images/agnhost:2.66.1
registry.k8s.io/e2e-test-images/busybox:1.37.0-2
registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1
registry.k8s.io/e2e-test-images/nginx:1.27.0-2
registry.k8s.io/e2e-test-images/nginx:1.28.0-2
registry.k8s.io/e2e-test-images/perl:5.26
registry.k8s.io/etcd:3.7.0-0
registry.k8s.io/pause:3.10.2
registry.k8s.io/build-image/distroless-iptables:v0.9.9
registry.k8s.io/e2e-test-images/regression-issue-74839:1.5
invalid.registry.k8s.io/invalid/alpine:3.1
`

const kubeadmListImages = `registry.k8s.io/kube-apiserver:v1.37.2
registry.k8s.io/kube-proxy:v1.37.2
registry.k8s.io/coredns/coredns:v1.14.6
registry.k8s.io/pause:3.10.1
registry.k8s.io/etcd:3.7.0-0
`

func TestPickNames(t *testing.T) {
	got, err := pickNames(strings.Split(e2eListImages, "\n"), strings.Split(kubeadmListImages, "\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		kindAgnhost:    {"registry.k8s.io/e2e-test-images/agnhost:2.55", "registry.k8s.io/e2e-test-images/agnhost:2.66.1"},
		kindBusybox:    {"registry.k8s.io/e2e-test-images/busybox:1.37.0-2"},
		kindDNSTest:    {"registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"},
		kindNginx:      {"registry.k8s.io/e2e-test-images/nginx:1.27.0-2", "registry.k8s.io/e2e-test-images/nginx:1.28.0-2"},
		kindPause:      {"docker.io/nftproxy-e2e/pause:1", "registry.k8s.io/pause:3.10.1", "registry.k8s.io/pause:3.10.2"},
		kindKubeProxy:  {"registry.k8s.io/kube-proxy:v1.37.2"},
		kindCoreDNS:    {"registry.k8s.io/coredns/coredns:v1.14.6"},
		kindProbe:      {"docker.io/nftproxy-e2e/probe:1"},
		kindIptables:   {"registry.k8s.io/build-image/distroless-iptables:v0.9.9"},
		kindIssue74839: {"registry.k8s.io/e2e-test-images/regression-issue-74839:1.5"},
	}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("pickNames =\n%v\nwant\n%v", got, want)
	}
	if tag := tagOf(got[kindCoreDNS], "registry.k8s.io/coredns/coredns"); tag != "v1.14.6" {
		t.Errorf("tagOf = %q", tag)
	}
	if tag := tagOf(got[kindPause], "registry.k8s.io/coredns/coredns"); tag != "" {
		t.Errorf("tagOf found %q in the pause names", tag)
	}
	noCoreDNS := strings.ReplaceAll(kubeadmListImages, "coredns/coredns", "other")
	if _, err := pickNames(strings.Split(e2eListImages, "\n"), strings.Split(noCoreDNS, "\n")); err == nil {
		t.Error("a kubeadm list without coredns was accepted")
	}
}

func TestBaseFiles(t *testing.T) {
	tree := NewTree()
	addBaseFiles(tree)
	addAlternatives(tree)
	for _, p := range []string{"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/bin/nc", "/usr/bin/awk", "/tmp"} {
		if !tree.Has(p) {
			t.Errorf("no %s", p)
		}
	}
	passwd, _ := tree.File("/etc/passwd")
	group, _ := tree.File("/etc/group")
	if !strings.Contains(string(passwd), ":1000:") || !strings.Contains(string(group), ":50000:") || !strings.Contains(string(passwd), "www-data:") {
		t.Error("agnhost's user 1000 and group 50000, or nginx's www-data, missing")
	}
}
