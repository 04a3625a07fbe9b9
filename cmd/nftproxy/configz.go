package main

import (
	"fmt"

	"k8s.io/component-base/configz"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
)

// configzName is the key /configz serves the configuration under, as
// upstream (the API group of KubeProxyConfiguration).
const configzName = "kubeproxy.config.k8s.io"

// publishConfigz makes /configz (installed on the metrics server by
// proxyhealth.MetricsMux) serve cfg, the effective configuration.
func publishConfigz(cfg *kpconfig.KubeProxyConfiguration) error {
	configz.Delete(configzName) // a second run in one process (tests) replaces it
	cz, err := configz.New(configzName)
	if err != nil {
		return fmt.Errorf("configz: %w", err)
	}
	if err := cz.Set(cfg); err != nil {
		return fmt.Errorf("configz: %w", err)
	}
	return nil
}
