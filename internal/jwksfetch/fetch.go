// Package jwksfetch keeps the JSON Web Key Sets that policies name by URL
// (key.jwt.jwks.url) up to date, for the manager to render into the
// sidecar configuration: the sidecars make no network call. Each URL is
// fetched when a policy first asks for it and then every Refresh; a fetch
// is bounded in time and size, over HTTPS only, to public addresses unless
// an admin allows more (a policy must not make the manager read its own
// endpoints, the cluster's, or a cloud metadata service). A failed fetch
// keeps the last good keys, and is retried sooner, backing off.
//
// The URLs are shared fairly: each namespace names at most
// MaxURLsPerNamespace of them, so one tenant cannot take the table from
// the others, and a URL is forgotten only once no namespace names it.
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
	"slices"
	"sync"
	"sync/atomic"
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
	// DefaultMaxURLsPerNamespace: a namespace rarely trusts more than a
	// few issuers; 100 namespaces at their share fill the table.
	DefaultMaxURLsPerNamespace = 10
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
	// MaxURLsPerNamespace bounds how many URLs the policies of one
	// namespace name; one more gets an error, not a fetch.
	MaxURLsPerNamespace int
	// RootCAs verify the issuers' certificates; nil: the system's.
	RootCAs *x509.CertPool
	// AllowedPrefixes are address ranges an admin allows although they
	// are not public (an issuer inside the cluster). Their fetches' errors
	// stay out of Result.Err's text (Result.Internal).
	AllowedPrefixes []netip.Prefix
	// AllowAddr says whether an address may be dialed; nil: PublicAddr,
	// or within AllowedPrefixes. A test's loopback issuer sets it.
	AllowAddr func(netip.Addr) bool
	// Internal says whether an allowed address is one whose fetch errors
	// a tenant must not read (Result.Internal); nil: not PublicAddr.
	Internal func(netip.Addr) bool
	// Changed is called (from the fetching goroutine, with its context,
	// which ends when the Fetcher stops) when a URL's result changes: new
	// keys, a new failure, or a recovery.
	Changed func(ctx context.Context, url string)
	// NamedBy is asked before each refresh which namespaces' policies
	// still name the URL: none forgets it, the others' shares are counted
	// from it; an error changes nothing. nil: the namespaces that asked.
	NamedBy func(url string) ([]string, error)
	// Log receives a line per failure and per change of keys.
	Log logr.Logger
}

// notPublic are ranges, besides those netip classifies, that are not
// routed on the internet: "this network", and the shared address space
// (RFC 6598) that some clusters give pods.
var notPublic = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/8"), netip.MustParsePrefix("100.64.0.0/10")}

// PublicAddr refuses the addresses of the manager's own host, of its link
// and of private networks: loopback, link-local (169.254.0.0/16 holds
// cloud metadata services), private (RFC 1918, unique local IPv6, where
// pods, Services and the nodes' own endpoints live), shared (RFC 6598),
// unspecified and multicast. An issuer inside the cluster needs an admin
// to allow its range (Options.AllowedPrefixes): a tenant's policy must not
// make the manager probe the cluster's network for it.
func PublicAddr(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsPrivate() || a.IsUnspecified() || a.IsMulticast() {
		return false
	}
	for _, p := range notPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

// Result is what is known of one URL.
type Result struct {
	// Keys is the last key set fetched, canonical; nil until one was.
	Keys []byte
	// Err is why the last fetch failed; nil when it succeeded.
	Err error
	// Internal: the last fetch dialed an address an admin allowed that is
	// not public. Err's text then says what an internal host answered, for
	// the manager's log, not for a tenant's status.
	Internal bool
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
	// owners are the namespaces whose policies name the URL: those that
	// asked since the last refresh, then NamedBy's answer.
	owners map[string]bool
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
	if opts.MaxURLsPerNamespace <= 0 {
		opts.MaxURLsPerNamespace = DefaultMaxURLsPerNamespace
	}
	if opts.AllowAddr == nil {
		allowed := opts.AllowedPrefixes
		opts.AllowAddr = func(a netip.Addr) bool {
			return PublicAddr(a) || slices.ContainsFunc(allowed, func(p netip.Prefix) bool { return p.Contains(a.Unmap()) })
		}
	}
	if opts.Internal == nil {
		opts.Internal = func(a netip.Addr) bool { return !PublicAddr(a) }
	}
	return &Fetcher{opts: opts, client: newClient(opts), entries: map[string]*entry{}}
}

// errRefused is the error of a URL whose host resolves to an address the
// manager does not dial. It names no address: which addresses a name
// inside the cluster has is not the tenant's to learn.
var errRefused = errors.New("its host resolves to an address the manager does not fetch keys from (loopback, link-local, private or shared ranges, unless an admin allows them with --jwks-allowed-cidrs)")

// internalKey marks a fetch's context with the flag its dials set when
// they reach an internal address (Options.Internal).
type internalKey struct{}

// newClient is an HTTPS client that dials only allowed addresses (checked
// on the address actually dialed, after DNS, so a name that resolves to
// loopback is refused too), follows at most 3 redirects to https URLs,
// and uses no proxy: what it reaches is what the policy named. Every fetch
// dials afresh (no keep-alive: they are minutes apart), so each says
// whether it reached an internal address.
func newClient(opts Options) *http.Client {
	dialer := &net.Dialer{
		Timeout: opts.Timeout,
		ControlContext: func(ctx context.Context, _, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil || !opts.AllowAddr(ap.Addr()) {
				return errRefused
			}
			if flag, ok := ctx.Value(internalKey{}).(*atomic.Bool); ok && opts.Internal(ap.Addr()) {
				flag.Store(true)
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
			DisableKeepAlives:     true,
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

// Get is what is known of url, for a policy of namespace ns, and registers
// it: the first Get of a URL starts fetching it (once Start runs). ok is
// false until the first attempt has finished. A namespace at its share, or
// a table that is full, gets an error for a URL it does not name yet; no
// URL another namespace names is given up for it.
func (f *Fetcher) Get(rawURL, ns string) (res Result, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, found := f.entries[rawURL]
	if found && e.owners[ns] {
		return e.res, e.done
	}
	if n := f.namedBy(ns); n >= f.opts.MaxURLsPerNamespace {
		return Result{Err: fmt.Errorf("the policies of namespace %s already name %d key set URLs, its share", ns, n)}, true
	}
	if found {
		e.owners[ns] = true
		return e.res, e.done
	}
	if len(f.entries) >= f.opts.MaxURLs {
		return Result{Err: fmt.Errorf("the manager already fetches %d key set URLs, its limit", f.opts.MaxURLs)}, true
	}
	f.entries[rawURL] = &entry{owners: map[string]bool{ns: true}}
	if f.ctx != nil {
		f.spawn(rawURL)
	}
	return Result{}, false
}

// namedBy counts the URLs namespace ns names; f.mu is held.
func (f *Fetcher) namedBy(ns string) int {
	n := 0
	for _, e := range f.entries {
		if e.owners[ns] {
			n++
		}
	}
	return n
}

// refreshOwners asks NamedBy who still names u, and reports false when
// nobody does: u is forgotten.
func (f *Fetcher) refreshOwners(u string) bool {
	if f.opts.NamedBy == nil {
		return true
	}
	names, err := f.opts.NamedBy(u)
	if err != nil {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(names) == 0 {
		delete(f.entries, u)
		return false
	}
	if e, ok := f.entries[u]; ok {
		e.owners = make(map[string]bool, len(names))
		for _, n := range names {
			e.owners[n] = true
		}
	}
	return true
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
		if !first && !f.refreshOwners(u) {
			return
		}
		keys, internal, err := f.fetch(ctx, u)
		if ctx.Err() != nil {
			return
		}
		if f.record(u, keys, internal, err) && f.opts.Changed != nil {
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
func (f *Fetcher) record(u string, keys []byte, internal bool, err error) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.entries[u]
	if !ok {
		return false
	}
	prev := e.res
	first := !e.done
	e.done = true
	e.res.Internal = internal
	if err != nil {
		e.res.Err = err
		f.opts.Log.Info("fetching a JWKS failed; the last good keys stay", "url", u, "haveKeys", e.res.Keys != nil, "error", err.Error())
	} else {
		e.res = Result{Keys: keys, Internal: internal}
		if !bytes.Equal(prev.Keys, keys) {
			f.opts.Log.Info("JWKS fetched", "url", u, "bytes", len(keys))
		}
	}
	return first || !bytes.Equal(prev.Keys, e.res.Keys) || errString(prev.Err) != errString(e.res.Err) || prev.Internal != internal
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// fetch gets u's key set and normalizes it (jwtverify.Normalize); internal
// says whether it dialed an internal address (Options.Internal).
func (f *Fetcher) fetch(ctx context.Context, u string) (keys []byte, internal bool, err error) {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme != "https" || parsed.Host == "" {
		return nil, false, errors.New("not an https URL")
	}
	var flag atomic.Bool
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, internalKey{}, &flag), f.opts.Timeout)
	defer cancel()
	keys, err = f.get(ctx, u)
	return keys, flag.Load(), err
}

// get is one GET of u within ctx, normalized.
func (f *Fetcher) get(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := f.client.Do(req)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("GET: no answer within %v", f.opts.Timeout)
	}
	if errors.Is(err, errRefused) {
		return nil, errRefused // without the dialer's wrapping, which names the address
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
