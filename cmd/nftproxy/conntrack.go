package main

import (
	"fmt"

	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/conntrack"
)

// sysctlEnv is where setupConntrack writes; tests replace it.
var sysctlEnv = conntrack.DefaultSysctlEnv

// setupConntrack applies the conntrack sysctls of the configuration once
// at startup, as upstream does before it starts proxying. Sysctls that are
// read-only or absent here (nf_conntrack_max inside a network namespace)
// are logged and left alone instead of failing startup; other errors fail
// it, as upstream's do.
func setupConntrack(c kpconfig.KubeProxyConntrackConfiguration) error {
	if _, err := conntrack.ApplySysctls(conntrackSysctls(c), sysctlEnv()); err != nil {
		return fmt.Errorf("set conntrack sysctls from the configuration: %w", err)
	}
	return nil
}

// conntrackSysctls converts the configuration; unset fields (nil, zero)
// leave the kernel's values alone.
func conntrackSysctls(c kpconfig.KubeProxyConntrackConfiguration) conntrack.Sysctls {
	s := conntrack.Sysctls{
		TCPBeLiberal:     c.TCPBeLiberal,
		UDPTimeout:       c.UDPTimeout.Duration,
		UDPStreamTimeout: c.UDPStreamTimeout.Duration,
	}
	if c.MaxPerCore != nil {
		s.MaxPerCore = int(*c.MaxPerCore)
	}
	if c.Min != nil {
		s.Min = int(*c.Min)
	}
	if c.TCPEstablishedTimeout != nil {
		s.TCPEstablishedTimeout = c.TCPEstablishedTimeout.Duration
	}
	if c.TCPCloseWaitTimeout != nil {
		s.TCPCloseWaitTimeout = c.TCPCloseWaitTimeout.Duration
	}
	return s
}
