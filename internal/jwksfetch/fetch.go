// Package jwksfetch keeps the JSON Web Key Sets that policies name by URL
// (key.jwt.jwks.url) up to date, for the manager to render into the
// sidecar configuration: the sidecars make no network call. Each URL is
// fetched when a policy first asks for it and then every Refresh; a fetch
// is bounded in time and size, over HTTPS only, to addresses that are not
// the manager's own (loopback, link-local: a policy must not make the
// manager read its own endpoints or a cloud metadata service). A failed
// fetch keeps the last good keys, and is retried sooner, backing off.
package jwksfetch

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/slidegate/slidegate/internal/jwtverify"
)

// Defaults of Options.
const (
	DefaultRefresh = 5 * time.Minute
	DefaultRetry   = 10 * time.Second
	DefaultTimeout = 10 * time.Second
	DefaultMaxURLs = 1000
)

// Options configure a Fetcher. Zero values take the defaults.
type Options struct {
	// Refresh is how often a URL's keys are fetched again after a success.
	// Issuers publish a new key ahead of signing with it; this plus the
	// kubelet's ConfigMap sync is how far ahead that must be.
	Refresh time.Duration
	// Retry is the wait after a first failure, doubled after each further
	// one, up to Refresh.
	Retry time.Duration
	// Timeout bounds one fetch, from dialing to the last byte.
	Timeout time.Duration
	// MaxBytes bounds a response body; 0: jwtverify.MaxInputBytes.
	MaxBytes int64
	// MaxURLs bounds how many URLs are kept; a policy that asks for one
	// more gets an error, not a fetch.
	MaxURLs int
	// RootCAs verify the issuers' certificates; nil: the system's.
	RootCAs *x509.CertPool
	// AllowAddr says whether an address may be dialed; nil: PublicAddr.
	AllowAddr func(netip.Addr) bool
	// Changed is called (from the fetching goroutine, with its context,
	// which ends when the Fetcher stops) when a URL's result changes: new
	// keys, a new failure, or a recovery.
	Changed func(ctx context.Context, url string)
	// InUse is asked before each refresh whether a policy still names the
	// URL; false forgets it. nil: always.
	InUse func(url string) bool
	// Log receives a line per failure and per change of keys.
	Log logr.Logger
}

// PublicAddr refuses the addresses of the manager's own host and of its
// link: loopback, link-local (169.254.0.0/16 holds cloud metadata
// services), unspecified and multicast. Private ranges are allowed: an
// issuer inside the cluster is a common case.
func PublicAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsValid() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsLinkLocalMulticast() &&
		!a.IsUnspecified() && !a.IsMulticast() && !netip.MustParsePrefix("0.0.0.0/8").Contains(a)
}

// Result is what is known of one URL.
type Result struct {
	// Keys is the last key set fetched, canonical; nil until one was.
	Keys []byte
	// Err is why the last fetch failed; nil when it succeeded.
	Err error
}

// Fetcher fetches and refreshes key sets by URL. Get registers a URL;
// Start (a manager Runnable) runs the fetches.
type Fetcher struct {
	opts   Options
	client *http.Client

	mu      sync.Mutex
	entries map[string]*entry
	ctx     context.Context // set by Start
	wg      sync.WaitGroup
}

type entry struct {
	res  Result
	done bool // an attempt finished
}

// New is a Fetcher with opts.
func New(opts Options) *Fetcher {
	if opts.Refresh <= 0 {
		opts.Refresh = DefaultRefresh
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultRetry
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = jwtverify.MaxInputBytes
	}
	if opts.MaxURLs <= 0 {
		opts.MaxURLs = DefaultMaxURLs
	}
	if opts.AllowAddr == nil {
		opts.AllowAddr = PublicAddr
	}
	return &Fetcher{opts: opts, client: newClient(opts), entries: map[string]*entry{}}
}

// newClient is an HTTPS client that dials only allowed addresses (checked
// on the address actually dialed, after DNS, so a name that resolves to
// loopback is refused too), follows at most 3 redirects to https URLs,
// and uses no proxy: what it reaches is what the policy named.
func newClient(opts Options) *http.Client {
	dialer := &net.Dialer{
		Timeout: opts.Timeout,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !opts.AllowAddr(ap.Addr()) {
				return fmt.Errorf("address %s refused: the manager does not fetch keys from loopback, link-local or unspecified addresses", address)
			}
			return nil
		},
	}
	return &http.Client{
		Timeout: opts.Timeout,
		Transport: &http.Transport{
			Proxy:                 nil,
			DialContext:           dialer.DialContext,
			TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: opts.RootCAs},
			TLSHandshakeTimeout:   opts.Timeout,
			ResponseHeaderTimeout: opts.Timeout,
			MaxIdleConnsPerHost:   1,
			IdleConnTimeout:       time.Minute,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 3 {
				return errors.New("more than 3 redirects")
			}
			if req.URL.Scheme != "https" {
				return fmt.Errorf("redirected to a %s URL; only https is fetched", req.URL.Scheme)
			}
			return nil
		},
	}
}

// Get is what is known of url, and registers it: the first Get of a URL
// starts fetching it (once Start runs). ok is false until the first
// attempt has finished.
func (f *Fetcher) Get(rawURL string) (res Result, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, found := f.entries[rawURL]; found {
		return e.res, e.done
	}
	if len(f.entries) >= f.opts.MaxURLs {
		return Result{Err: fmt.Errorf("the manager already fetches %d key set URLs, its limit", f.opts.MaxURLs)}, true
	}
	f.entries[rawURL] = &entry{}
	if f.ctx != nil {
		f.spawn(rawURL)
	}
	return Result{}, false
}

// Start runs the fetches until ctx ends, then waits for them to stop.
func (f *Fetcher) Start(ctx context.Context) error {
	f.mu.Lock()
	f.ctx = ctx
	for u := range f.entries {
		f.spawn(u)
	}
	f.mu.Unlock()
	<-ctx.Done()
	f.wg.Wait()
	return nil
}

// spawn starts url's loop; f.mu is held.
func (f *Fetcher) spawn(u string) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.loop(f.ctx, u)
	}()
}

// loop fetches u now, then again after Refresh (or, after a failure, the
// backed-off Retry), until ctx ends or no policy names u any more.
func (f *Fetcher) loop(ctx context.Context, u string) {
	failures := 0
	for first := true; ; first = false {
		if !first && f.opts.InUse != nil && !f.opts.InUse(u) {
			f.mu.Lock()
			delete(f.entries, u)
			f.mu.Unlock()
			return
		}
		keys, err := f.fetch(ctx, u)
		if ctx.Err() != nil {
			return
		}
		if f.record(u, keys, err) && f.opts.Changed != nil {
			f.opts.Changed(ctx, u)
		}
		wait := f.opts.Refresh
		if err != nil {
			wait = min(f.opts.Retry<<min(failures, 16), f.opts.Refresh)
			failures++
		} else {
			failures = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// record stores the outcome of a fetch of u, keeping the last good keys
// on failure, and reports whether the result changed.
func (f *Fetcher) record(u string, keys []byte, err error) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.entries[u]
	if !ok {
		return false
	}
	prev := e.res
	first := !e.done
	e.done = true
	if err != nil {
		e.res.Err = err
		f.opts.Log.Info("fetching a JWKS failed; the last good keys stay", "url", u, "haveKeys", e.res.Keys != nil, "error", err.Error())
	} else {
		e.res = Result{Keys: keys}
		if !bytes.Equal(prev.Keys, keys) {
			f.opts.Log.Info("JWKS fetched", "url", u, "bytes", len(keys))
		}
	}
	return first || !bytes.Equal(prev.Keys, e.res.Keys) || errString(prev.Err) != errString(e.res.Err)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// fetch gets u's key set and normalizes it (jwtverify.Normalize).
func (f *Fetcher) fetch(ctx context.Context, u string) ([]byte, error) {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme != "https" || parsed.Host == "" {
		return nil, errors.New("not an https URL")
	}
	ctx, cancel := context.WithTimeout(ctx, f.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := f.client.Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("GET: no answer within %v", f.opts.Timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("GET: %w", unwrapURLError(err))
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET: HTTP status %d", resp.StatusCode)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.opts.MaxBytes+1))
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("reading the response: not complete within %v", f.opts.Timeout)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	if int64(len(body)) > f.opts.MaxBytes {
		return nil, fmt.Errorf("the response is larger than %d bytes", f.opts.MaxBytes)
	}
	keys, _, err := jwtverify.Normalize(body)
	if err != nil {
		return nil, err
	}
	return keys, nil
}

// unwrapURLError drops the *url.Error wrapper, which repeats the URL the
// caller already names.
func unwrapURLError(err error) error {
	if ue, ok := errors.AsType[*url.Error](err); ok {
		return ue.Err
	}
	return err
}
