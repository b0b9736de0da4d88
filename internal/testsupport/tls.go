package testsupport

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// PKI is a private CA with one server and one client certificate, as PEM
// files in one directory, for tests of TLS to Redis. The leaf certificates
// are valid for localhost and 127.0.0.1.
type PKI struct {
	CA                    string // ca.pem
	ServerCert, ServerKey string // server.pem, server-key.pem
	ClientCert, ClientKey string // client.pem, client-key.pem

	dir   string
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// NewPKI writes a fresh PKI into a temporary directory of tb.
func NewPKI(tb testing.TB) PKI {
	tb.Helper()
	p, err := WritePKI(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// WritePKI writes a fresh PKI into dir, for programs without a testing.TB
// (the benchmarks).
func WritePKI(dir string) (PKI, error) {
	ca, caKey, err := writeCA(dir)
	if err != nil {
		return PKI{}, err
	}
	if err := writeLeaf(dir, "server", ca, caKey, x509.ExtKeyUsageServerAuth); err != nil {
		return PKI{}, err
	}
	if err := writeLeaf(dir, "client", ca, caKey, x509.ExtKeyUsageClientAuth); err != nil {
		return PKI{}, err
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	return PKI{
		CA:         p("ca.pem"),
		ServerCert: p("server.pem"), ServerKey: p("server-key.pem"),
		ClientCert: p("client.pem"), ClientKey: p("client-key.pem"),
		dir: dir, ca: ca, caKey: caKey,
	}, nil
}

// IssueClient writes another client certificate of the PKI's CA, named
// name (a file name), whose SANs are the given URIs (e.g. SPIFFE IDs)
// besides localhost and 127.0.0.1, and returns its certificate and key
// files.
func (p PKI) IssueClient(tb testing.TB, name string, uris ...string) (cert, key string) {
	tb.Helper()
	var us []*url.URL
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			tb.Fatal(err)
		}
		us = append(us, u)
	}
	if err := writeLeaf(p.dir, name, p.ca, p.caKey, x509.ExtKeyUsageClientAuth, us...); err != nil {
		tb.Fatal(err)
	}
	return filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
}

// RedisTLSArgs are redis-server arguments that serve TLS on tlsPort with
// the PKI's server certificate; clientAuth requires client certificates.
func (p PKI) RedisTLSArgs(tlsPort int, clientAuth bool) []string {
	auth := "no"
	if clientAuth {
		auth = "yes"
	}
	return []string{
		"--tls-port", strconv.Itoa(tlsPort),
		"--tls-cert-file", p.ServerCert,
		"--tls-key-file", p.ServerKey,
		"--tls-ca-cert-file", p.CA,
		"--tls-auth-clients", auth,
	}
}

// StartTLSRedis starts a redis-server for one test that also serves TLS
// with the PKI's server certificate (clientAuth: client certificates are
// required) and returns it with its TLS address. Like NewRedis it tries
// other ports when one is taken between the probe and the bind.
func StartTLSRedis(tb testing.TB, p PKI, clientAuth bool) (*Redis, string) {
	tb.Helper()
	if _, err := RedisServerPath(); err != nil {
		Missing(tb, "redis-server", err)
	}
	var lastErr error
	for range 5 {
		tlsPort, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		r, err := NewRedis(p.RedisTLSArgs(tlsPort, clientAuth)...)
		if err != nil {
			lastErr = err
			continue
		}
		tb.Cleanup(r.Close)
		return r, net.JoinHostPort("127.0.0.1", strconv.Itoa(tlsPort))
	}
	tb.Fatalf("starting redis-server with TLS: %v", lastErr)
	return nil, ""
}

func writeCA(dir string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "slidegate test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(filepath.Join(dir, "ca.pem"), "CERTIFICATE", der); err != nil {
		return nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, err
}

func writeLeaf(dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, usage x509.ExtKeyUsage, uris ...*url.URL) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		URIs:         uris,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, name+".pem"), "CERTIFICATE", der); err != nil {
		return err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, name+"-key.pem"), "EC PRIVATE KEY", kder)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
