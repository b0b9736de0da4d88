package rls

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/slidegate/slidegate/internal/dirwatch"
)

// TLSOptions are the gRPC listener's TLS settings. The files are read
// again whenever a connection is set up (each time from one version of a
// mounted Secret: dirwatch.Snapshot), so a renewed certificate or CA
// applies to the next connection without a restart. A gateway keeps its
// connections open, so reading is rare; unchanged files are not parsed
// again.
type TLSOptions struct {
	// CertFile and KeyFile are the server's key pair (PEM). Both or neither:
	// neither serves plaintext (h2c).
	CertFile, KeyFile string
	// ClientCAFile (PEM) makes every caller present a certificate that it
	// signed, for client authentication; without one the handshake fails.
	// It needs CertFile and KeyFile: callers are authenticated over TLS
	// only, so no plaintext listener can be left open beside it.
	ClientCAFile string
	// ClientNames, if any, are the caller identities allowed: a caller's
	// certificate must carry one of them as a URI SAN (a SPIFFE ID such as
	// spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway-service-account)
	// or a DNS SAN. Needed when the client CA signs more than the gateways
	// (a mesh CA signs every workload of the mesh). Empty: any certificate
	// the client CA signed.
	ClientNames []string
}

// Enabled reports whether the listener serves TLS.
func (o TLSOptions) Enabled() bool { return o.CertFile != "" }

// ClientAuth reports whether callers must present a client certificate.
func (o TLSOptions) ClientAuth() bool { return o.ClientCAFile != "" }

// Validate checks that the settings go together.
func (o TLSOptions) Validate() error {
	var errs []error
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-key-file go together"))
	}
	if o.ClientCAFile != "" && o.CertFile == "" {
		errs = append(errs, errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-key-file: callers are authenticated over TLS only, never on a plaintext listener"))
	}
	if len(o.ClientNames) > 0 && o.ClientCAFile == "" {
		errs = append(errs, errors.New("--tls-client-names needs --tls-client-ca-file: names are checked on certificates the client CA signed"))
	}
	for _, n := range o.ClientNames {
		if n == "" || strings.TrimSpace(n) != n {
			errs = append(errs, fmt.Errorf("--tls-client-names: %q is not a name", n))
		}
	}
	return errors.Join(errs...)
}

// TLSCreds returns the gRPC server option that serves o over TLS, after
// reading the files once, so that a missing or bad file stops the start
// instead of every handshake. Handshakes that fail (no certificate, one of
// another CA or name, plaintext) are counted in
// slidegate_rls_tls_handshake_failures_total.
func (s *Server) TLSCreds(o TLSOptions) (grpc.ServerOption, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if !o.Enabled() {
		return nil, errors.New("rls: TLSCreds without a certificate")
	}
	f := &tlsFiles{opts: o, log: s.log}
	if _, err := f.config(); err != nil {
		return nil, err
	}
	base := credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		// gRPC adds "h2" to the returned config (and refuses a client that
		// negotiates no ALPN protocol).
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return f.config() },
	})
	return grpc.Creds(&countedCreds{TransportCredentials: base, failures: s.metrics.handshakeFailures, log: s.log}), nil
}

// tlsFiles builds the listener's tls.Config from the files as they are
// now, and keeps the last one built while the files do not change.
type tlsFiles struct {
	opts TLSOptions
	log  *slog.Logger

	mu      sync.Mutex
	pem     [3][]byte // cert, key, client CA as last read
	cfg     *tls.Config
	lastErr string
}

// config reads the files and returns the config for them. If they cannot
// be read or parsed (a rotation half done by hand), the last good config
// stays in use, and the problem is logged once.
func (f *tlsFiles) config() (*tls.Config, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cfg, err := f.load()
	if err != nil {
		if msg := err.Error(); msg != f.lastErr {
			f.lastErr = msg
			f.log.Error("TLS files not loaded; the last good ones stay in use", "error", err)
		}
		if f.cfg != nil {
			return f.cfg, nil
		}
		return nil, err
	}
	f.lastErr = ""
	return cfg, nil
}

func (f *tlsFiles) load() (*tls.Config, error) {
	var cur [3][]byte
	for i, path := range []string{f.opts.CertFile, f.opts.KeyFile, f.opts.ClientCAFile} {
		if path == "" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dirwatch.Snapshot(filepath.Dir(path)), filepath.Base(path)))
		if err != nil {
			return nil, fmt.Errorf("rls tls: %w", err)
		}
		cur[i] = b
	}
	if f.cfg != nil && slices.EqualFunc(cur[:], f.pem[:], bytes.Equal) {
		return f.cfg, nil
	}
	pair, err := tls.X509KeyPair(cur[0], cur[1])
	if err != nil {
		return nil, fmt.Errorf("rls tls: %s and %s: %w", f.opts.CertFile, f.opts.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if f.opts.ClientAuth() {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(cur[2]) {
			return nil, fmt.Errorf("rls tls: no PEM certificate in %s", f.opts.ClientCAFile)
		}
		cfg.ClientCAs = pool
		// Verified against the pool, with the client-auth extended key
		// usage, before VerifyConnection runs.
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		if len(f.opts.ClientNames) > 0 {
			cfg.VerifyConnection = allowNames(f.opts.ClientNames)
		}
	}
	f.pem, f.cfg = cur, cfg
	return cfg, nil
}

// allowNames refuses a verified client certificate that carries none of
// names as a URI or DNS SAN.
func allowNames(names []string) func(tls.ConnectionState) error {
	allowed := map[string]bool{}
	for _, n := range names {
		allowed[n] = true
	}
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("no client certificate")
		}
		leaf := cs.PeerCertificates[0]
		var got []string
		for _, u := range leaf.URIs {
			if allowed[u.String()] {
				return nil
			}
			got = append(got, u.String())
		}
		for _, d := range leaf.DNSNames {
			if allowed[d] {
				return nil
			}
			got = append(got, d)
		}
		return fmt.Errorf("client certificate names %q: none is allowed (--tls-client-names)", got)
	}
}

// countedCreds counts the handshakes that fail: a caller without a valid
// certificate is refused there, before any RLS call.
type countedCreds struct {
	credentials.TransportCredentials
	failures interface{ Inc() }
	log      *slog.Logger
}

func (c *countedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.failures.Inc()
		// Debug: anyone who reaches the port can cause these.
		if c.log.Enabled(context.Background(), slog.LevelDebug) {
			c.log.Debug("TLS handshake refused", "remote", conn.RemoteAddr().String(), "error", err)
		}
	}
	return out, info, err
}

func (c *countedCreds) Clone() credentials.TransportCredentials {
	return &countedCreds{TransportCredentials: c.TransportCredentials.Clone(), failures: c.failures, log: c.log}
}
