package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a CA made at test time, with a server certificate for 127.0.0.1 and a
// client certificate signed by it, written as PEM files in a directory of the test's.
type PKI struct {
	CA                    string // the CA certificate's file
	ServerCert, ServerKey string // the server's certificate and key files
	ClientCert, ClientKey string // the client's certificate and key files
	Pool                  *x509.CertPool
	Client                tls.Certificate
}

// NewPKI makes a PKI for one test; a failure fails the test.
func NewPKI(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dedupkit test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := PKI{CA: filepath.Join(dir, "ca.crt"), Pool: x509.NewCertPool()}
	p.Pool.AddCert(ca)
	writePEM(t, p.CA, "CERTIFICATE", caDER)

	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (certFile, keyFile string, cert tls.Certificate) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
		return certFile, keyFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	p.ServerCert, p.ServerKey, _ = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.ClientCert, p.ClientKey, p.Client = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

// RedisTLSArgs are the redis-server arguments (for SpawnRedis) of a server that
// speaks only TLS, with p's server certificate, and requires a client certificate
// signed by p's CA.
func (p PKI) RedisTLSArgs() []string {
	return []string{"--tls-cert-file", p.ServerCert, "--tls-key-file", p.ServerKey,
		"--tls-ca-cert-file", p.CA, "--tls-auth-clients", "yes"}
}

// ClientTLS is a client's TLS config for a server with p's certificate: it trusts
// p's CA and presents p's client certificate.
func (p PKI) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: p.Pool, Certificates: []tls.Certificate{p.Client}, MinVersion: tls.VersionTLS12}
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
