package kubenode

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"
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
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "nftproxy-e2e-kubelet-client-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		// kubeadm's name for this certificate.
		Subject:     pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"kubeadm:cluster-admins"}},
		NotBefore:   now.Add(-time.Hour),
		NotAfter:    now.Add(7 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
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
		typ  string
		der  []byte
	}{{p.CAFile, "CERTIFICATE", caDER}, {p.CertFile, "CERTIFICATE", der}, {p.KeyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.path, err)
		}
	}
	return p, nil
}

// APIServerFlags are kube-apiserver's flags for the client certificate.
func (p *KubeletClientPKI) APIServerFlags() []string {
	return []string{"--kubelet-client-certificate=" + p.CertFile, "--kubelet-client-key=" + p.KeyFile}
}
