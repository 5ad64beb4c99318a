package dedup

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupkit/dedupkit/dedup/redisstore"
	"github.com/dedupkit/dedupkit/dedup/storetest"
	"github.com/dedupkit/dedupkit/internal/testenv"
)

// testPKI is a CA made at test time, a server certificate for 127.0.0.1 and a client
// certificate, both signed by it, written as PEM files under dir.
type testPKI struct {
	dir    string
	pool   *x509.CertPool
	client tls.Certificate
}

func newTestPKI(t *testing.T) testPKI {
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
	writePEM(t, filepath.Join(dir, "ca.crt"), "CERTIFICATE", caDER)

	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
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
		writePEM(t, filepath.Join(dir, name+".crt"), "CERTIFICATE", der)
		writePEM(t, filepath.Join(dir, name+".key"), "EC PRIVATE KEY", keyDER)
		return der, key
	}
	leaf("server", 2, x509.ExtKeyUsageServerAuth)
	clientDER, clientKey := leaf("client", 3, x509.ExtKeyUsageClientAuth)

	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return testPKI{dir: dir, pool: pool, client: tls.Certificate{Certificate: [][]byte{clientDER}, PrivateKey: clientKey}}
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// spawnTLSRedis starts a redis-server of our own that speaks only TLS and requires a
// client certificate signed by the test CA.
func spawnTLSRedis(t *testing.T, pki testPKI) string {
	t.Helper()
	return spawnRedis(t,
		"--tls-cert-file", filepath.Join(pki.dir, "server.crt"),
		"--tls-key-file", filepath.Join(pki.dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(pki.dir, "ca.crt"),
		"--tls-auth-clients", "yes")
}

// tlsClient is what the README shows: a rediss:// URL through redis.ParseURL, with the
// CA and the client certificate added to the TLS config it makes.
func tlsClient(t *testing.T, addr string, pki testPKI) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL("rediss://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	opts.TLSConfig.RootCAs = pki.pool
	opts.TLSConfig.Certificates = []tls.Certificate{pki.client}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// Every conformance case passes over TLS (rediss://, mutual TLS).
func TestEveryConformanceCasePassesOverTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	addr := spawnTLSRedis(t, pki)
	c := tlsClient(t, addr, pki)
	st, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	storetest.Run(t, func(t *testing.T) storetest.Backend {
		return storetest.Backend{Store: st, Prefix: testenv.Prefix(), Advance: time.Sleep, Raw: testenv.RedisRaw(c)}
	})
}

// Every Store operation, the batch forms and the EVAL fallback run over TLS.
func TestTLSStoreFlow(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	c := tlsClient(t, spawnTLSRedis(t, pki), pki)
	st, err := redisstore.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := storeFlow(context.Background(), st, c, testenv.Prefix()); err != nil {
		t.Fatal(err)
	}
}

// A Deduper runs over TLS; a client that does not trust the server's CA, or that
// speaks plain TCP, gets a store error and fn does not run (fail closed).
func TestDeduperRunsOverTLSAndFailsClosedWithoutTrust(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	addr := spawnTLSRedis(t, pki)
	ctx := context.Background()
	handler := func(c *redis.Client) *Handler {
		st, err := redisstore.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return newDeduperOver(t, st).mustRegister(t, "orders", WithLocalCache(0, 0))
	}

	h := handler(tlsClient(t, addr, pki))
	res, err := h.Do(ctx, "k1", ok)
	want(t, res, err, Processed)
	res, err = h.Do(ctx, "k1", ok)
	want(t, res, err, Duplicate)

	untrusting, err := redis.ParseURL("rediss://" + addr) // the system roots only
	if err != nil {
		t.Fatal(err)
	}
	untrusting.TLSConfig.Certificates = []tls.Certificate{pki.client}
	untrusting.MaxRetries = -1
	plain := &redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second}
	for name, opts := range map[string]*redis.Options{"unknown CA": untrusting, "plain TCP": plain} {
		c := redis.NewClient(opts)
		t.Cleanup(func() { c.Close() })
		ran := false
		res, err := handler(c).Do(ctx, "k2", func(context.Context) error { ran = true; return nil })
		want(t, res, err, StoreUnavailable)
		if ran || !errors.Is(err, ErrStoreUnavailable) {
			t.Fatalf("%s: ran %v, err %v", name, ran, err)
		}
		var unknown x509.UnknownAuthorityError
		if name == "unknown CA" && !errors.As(err, &unknown) {
			t.Fatalf("%s: err %v, want x509.UnknownAuthorityError", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}
