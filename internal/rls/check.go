package rls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// CheckOptions describe one ShouldRateLimit call of the quick check
// (`rls check`): what a gateway would send, without a gateway or grpcurl.
type CheckOptions struct {
	Target string // host:port of the RLS server
	// TLS dials with TLS, verified against CAFile (default: system roots);
	// CertFile and KeyFile present a client certificate, for a server
	// that authenticates its callers (--tls-client-ca-file).
	TLS               bool
	CAFile            string
	CertFile, KeyFile string
	Domain            string
	// Descriptors, one per element, each "key=value,key=value".
	Descriptors []string
	Hits        uint32
}

// ParseDescriptor reads "key=value,key=value" (a value may be empty, a key
// may not; no escaping: for values with commas, use a real client).
func ParseDescriptor(s string) (*ratelimitv3.RateLimitDescriptor, error) {
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor %q: %q is not key=value", s, kv)
		}
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d, nil
}

// Check sends one request and writes the response as JSON to w.
func Check(ctx context.Context, o CheckOptions, w io.Writer) (*rlsv3.RateLimitResponse, error) {
	if len(o.Descriptors) == 0 {
		return nil, errors.New("at least one -descriptor is required")
	}
	req := &rlsv3.RateLimitRequest{Domain: o.Domain, HitsAddend: o.Hits}
	for _, s := range o.Descriptors {
		d, err := ParseDescriptor(s)
		if err != nil {
			return nil, err
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	creds := insecure.NewCredentials()
	if o.TLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.CAFile != "" {
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, err
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s holds no PEM certificate", o.CAFile)
			}
		}
		if o.CertFile != "" || o.KeyFile != "" {
			pair, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		creds = credentials.NewTLS(cfg)
	}
	conn, err := grpc.NewClient(o.Target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
	if err != nil {
		return nil, err
	}
	out, err := protojson.MarshalOptions{Multiline: true}.Marshal(resp)
	if err != nil {
		return nil, err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return resp, err
}
