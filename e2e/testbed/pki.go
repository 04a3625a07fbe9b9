package testbed

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// pki is the key material of one bed, written to files the API server reads.
type pki struct {
	caPEM                   []byte
	servingCert, servingKey string // files: API server TLS
	saPub, saKey            string // files: service account token signing
	adminToken, proxyToken  string
	tokenFile               string // file: --token-auth-file
}

// newPKI creates a CA, a serving certificate for the API server valid for every address a
// client may use (fabric, first Service IPs, loopback), a service-account signing key and
// bearer tokens. Own certificates, rather than the API server's self-signed ones, let
// kubeconfigs verify TLS like in a real cluster. ECDSA keys keep generation instant.
func newPKI(dir string) (*pki, error) {
	ca, err := NewCA("nftproxy-e2e-ca")
	if err != nil {
		return nil, err
	}
	srvCert, srvKeyPEM, err := ca.Issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{
			net.ParseIP(ControlIPv4), net.ParseIP(ControlIPv6), net.ParseIP("10.96.0.1"),
			net.ParseIP("fd00:96::1"), net.ParseIP("127.0.0.1"), net.ParseIP("::1"),
		},
	})
	if err != nil {
		return nil, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	p := &pki{
		caPEM:       ca.PEM,
		servingCert: filepath.Join(dir, "apiserver.crt"),
		servingKey:  filepath.Join(dir, "apiserver.key"),
		saPub:       filepath.Join(dir, "sa.pub"),
		saKey:       filepath.Join(dir, "sa.key"),
		adminToken:  randomToken(),
		proxyToken:  randomToken(),
		tokenFile:   filepath.Join(dir, "tokens.csv"),
	}
	saKeyPEM, err := ecKeyPEM(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	// token,user,uid,"group,..." — see --token-auth-file.
	tokens := fmt.Sprintf("%s,%s,%s,%s\n%s,%s,%s\n",
		p.adminToken, AdminUser, AdminUser, "system:masters", p.proxyToken, ProxyUser, ProxyUser)
	files := []struct {
		path string
		data []byte
	}{
		{p.servingCert, append(srvCert, p.caPEM...)},
		{p.servingKey, srvKeyPEM},
		{p.saKey, saKeyPEM},
		{p.saPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER})},
		{p.tokenFile, []byte(tokens)},
	}
	for _, f := range files {
		if err := os.WriteFile(f.path, f.data, 0o600); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// CA is a certificate authority of a bed's own (the API server's serving
// certificate; make conformance's kubelet client certificate): an ECDSA
// key, which is instant to generate, and a self-signed certificate valid
// from an hour ago for a week.
type CA struct {
	// PEM is the CA's certificate, PEM-encoded: what clients trust.
	PEM  []byte
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	next int64 // the next serial number
}

// NewCA makes a CA named commonName.
func NewCA(commonName string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: commonName},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	setValidity(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert: cert, key: key, next: 2}, nil
}

// Issue signs a certificate of tmpl (its subject, usages and names; the CA
// sets the serial number and the validity) for a new ECDSA key, and returns
// both PEM-encoded.
func (ca *CA) Issue(tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	t := *tmpl
	t.SerialNumber = big.NewInt(ca.next)
	ca.next++
	setValidity(&t)
	der, err := x509.CreateCertificate(rand.Reader, &t, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = ecKeyPEM(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// setValidity makes a certificate valid from an hour ago (clocks of the
// bed's processes agree, but a certificate made this second must not be
// "not yet valid" to anyone) for a week.
func setValidity(c *x509.Certificate) {
	now := time.Now()
	c.NotBefore, c.NotAfter = now.Add(-time.Hour), now.Add(7*24*time.Hour)
}

func ecKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// writeKubeconfig writes a kubeconfig for server, verifying TLS with caPEM and
// authenticating with token.
func writeKubeconfig(path, server, user, token string, caPEM []byte) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["e2e"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["e2e"] = &clientcmdapi.Context{Cluster: "e2e", AuthInfo: user}
	cfg.CurrentContext = "e2e"
	return clientcmd.WriteToFile(*cfg, path)
}
