package kubenode

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// KubeletClientPKI is what lets the API server talk to kubelets (kubectl
// exec, logs, port-forward; the suite uses them throughout): a CA the
// kubelets trust for client certificates (authentication.x509.clientCAFile)
// and a certificate it signed for the API server
// (--kubelet-client-certificate/--kubelet-client-key). The kubelets keep
// authorization AlwaysAllow, so any client the CA vouches for may do
// anything: the CA signs this one certificate only.
type KubeletClientPKI struct {
	CAFile, CertFile, KeyFile string
}

// NewKubeletClientPKI writes the CA and the API server's client certificate
// into dir. Make it before testbed.Start and pass APIServerFlags.
func NewKubeletClientPKI(dir string) (*KubeletClientPKI, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ca, err := testbed.NewCA("nftproxy-e2e-kubelet-client-ca")
	if err != nil {
		return nil, err
	}
	cert, key, err := ca.Issue(&x509.Certificate{
		// kubeadm's name for this certificate.
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"kubeadm:cluster-admins"}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, err
	}
	p := &KubeletClientPKI{
		CAFile:   filepath.Join(dir, "kubelet-client-ca.crt"),
		CertFile: filepath.Join(dir, "apiserver-kubelet-client.crt"),
		KeyFile:  filepath.Join(dir, "apiserver-kubelet-client.key"),
	}
	for _, f := range []struct {
		path string
		pem  []byte
	}{{p.CAFile, ca.PEM}, {p.CertFile, cert}, {p.KeyFile, key}} {
		if err := os.WriteFile(f.path, f.pem, 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return p, nil
}

// APIServerFlags are kube-apiserver's flags for the client certificate.
func (p *KubeletClientPKI) APIServerFlags() []string {
	return []string{"--kubelet-client-certificate=" + p.CertFile, "--kubelet-client-key=" + p.KeyFile}
}
