package jwksfetch_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/slidegate/slidegate/internal/jwksfetch"
	"github.com/slidegate/slidegate/internal/jwtverify"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// issuer is an httptest TLS server on loopback that serves whatever its
// handler says, counting requests.
type issuer struct {
	*httptest.Server
	mu       sync.Mutex
	status   int
	body     []byte
	delay    time.Duration
	requests atomic.Int64
}

func newIssuer(t *testing.T, body []byte) *issuer {
	is := &issuer{status: http.StatusOK, body: body}
	is.Server = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		is.requests.Add(1)
		is.mu.Lock()
		status, body, delay := is.status, is.body, is.delay
		is.mu.Unlock()
		if delay > 0 {
			select {
			case <-time.After(delay):
			case <-r.Context().Done():
				// No answer at all: returning would send an empty 200, an
				// answer this issuer never means to give.
				panic(http.ErrAbortHandler)
			}
		}
		w.WriteHeader(status)
		_, _ = w.Write(body)
	}))
	t.Cleanup(is.Close)
	return is
}

func (is *issuer) serve(status int, body []byte, delay time.Duration) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.status, is.body, is.delay = status, body, delay
}

// loopback allows the test's loopback issuer.
func loopback(a netip.Addr) bool { return a.IsLoopback() }

// started is a running Fetcher for the test's issuers, with a short
// refresh; changes counts Changed calls by URL.
func started(t *testing.T, is *issuer, mod func(*jwksfetch.Options)) (*jwksfetch.Fetcher, *sync.Map) {
	t.Helper()
	changes := &sync.Map{}
	opts := jwksfetch.Options{
		Refresh:   100 * time.Millisecond,
		Retry:     50 * time.Millisecond,
		Timeout:   2 * time.Second,
		AllowAddr: loopback,
		Changed: func(_ context.Context, u string) {
			n, _ := changes.LoadOrStore(u, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		},
	}
	if is != nil {
		opts.RootCAs = is.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	}
	if mod != nil {
		mod(&opts)
	}
	f := jwksfetch.New(opts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return f, changes
}

// wait polls f for url until cond holds.
func wait(t *testing.T, f *jwksfetch.Fetcher, url, what string, cond func(jwksfetch.Result) bool) jwksfetch.Result {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, ok := f.Get(url, "ns")
		if ok && cond(res) {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never (last result %+v, done %v)", what, res, ok)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func canonical(t *testing.T, set []byte) []byte {
	t.Helper()
	c, _, err := jwtverify.Normalize(set)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestFetchAndRefresh: the first Get starts a fetch, its keys come
// normalized, and a key the issuer adds is picked up by a refresh.
func TestFetchAndRefresh(t *testing.T) {
	k1 := testsupport.NewJWTKey("k1", jose.ES256)
	k2 := testsupport.NewJWTKey("k2", jose.ES256)
	is := newIssuer(t, testsupport.JWKSet(k1))
	f, changes := started(t, is, nil)
	url := is.URL + "/.well-known/jwks.json"
	if _, ok := f.Get(url, "ns"); ok {
		t.Fatal("a result before any fetch")
	}
	wait(t, f, url, "the first keys", func(r jwksfetch.Result) bool { return bytes.Equal(r.Keys, canonical(t, testsupport.JWKSet(k1))) })
	is.serve(http.StatusOK, testsupport.JWKSet(k1, k2), 0)
	wait(t, f, url, "the rotated keys", func(r jwksfetch.Result) bool {
		return r.Err == nil && bytes.Equal(r.Keys, canonical(t, testsupport.JWKSet(k1, k2)))
	})
	// Changed comes after the result is recorded, so Get may show the new
	// keys a moment before the second call: wait for it, then for a few
	// refreshes with the same keys, which are no change.
	deadline := time.Now().Add(5 * time.Second)
	for changedTimes(changes, url) < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(3 * 100 * time.Millisecond)
	if n := changedTimes(changes, url); n != 2 {
		t.Errorf("Changed called %d times, want 2 (first keys, new keys; refreshes with the same keys are no change)", n)
	}
}

// changedTimes is how many times Changed was called for url.
func changedTimes(changes *sync.Map, url string) int64 {
	n, ok := changes.Load(url)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// TestFailureKeepsLastGood: whatever makes a refresh fail, the last good
// keys stay and the failure is said; the next success clears it.
func TestFailureKeepsLastGood(t *testing.T) {
	k1 := testsupport.NewJWTKey("k1", jose.ES256)
	good := testsupport.JWKSet(k1)
	failures := []struct {
		name   string
		status int
		body   []byte
		delay  time.Duration
		want   string
	}{
		{"server error", http.StatusInternalServerError, nil, 0, "HTTP status 500"},
		{"not a key set", http.StatusOK, []byte("<html>login</html>"), 0, "not a JSON Web Key Set"},
		{"only a symmetric key", http.StatusOK, []byte(`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`), 0, "no usable signing key"},
		{"too large", http.StatusOK, append([]byte(`{"keys":[]`), bytes.Repeat([]byte(" "), jwtverify.MaxInputBytes)...), 0, "larger than 262144 bytes"},
		{"too slow", http.StatusOK, good, 5 * time.Second, "no answer within 500ms"},
	}
	for _, tt := range failures {
		t.Run(tt.name, func(t *testing.T) {
			is := newIssuer(t, good)
			f, _ := started(t, is, func(o *jwksfetch.Options) { o.Timeout = 500 * time.Millisecond })
			url := is.URL + "/keys"
			f.Get(url, "ns")
			wait(t, f, url, "the good keys", func(r jwksfetch.Result) bool { return r.Keys != nil && r.Err == nil })
			is.serve(tt.status, tt.body, tt.delay)
			// Every failure keeps the last good keys; the one this issuer's
			// answer causes must come. Another failure first is logged: CI
			// once saw "too slow" answered with an empty 200 (the server had
			// ended the request's context while the client still waited,
			// cause not found; the issuer now sends no answer then).
			seen := map[string]bool{}
			wait(t, f, url, "the failure "+tt.want, func(r jwksfetch.Result) bool {
				if r.Err == nil {
					return false
				}
				if e := r.Err.Error(); !seen[e] {
					seen[e] = true
					if !bytes.Equal(r.Keys, canonical(t, good)) {
						t.Errorf("keys after a failed refresh (%v): %s, want the last good", r.Err, r.Keys)
					}
					if !strings.Contains(e, tt.want) {
						t.Logf("a failure before the one awaited: %v", r.Err)
					}
				}
				return strings.Contains(r.Err.Error(), tt.want)
			})
			is.serve(http.StatusOK, good, 0)
			wait(t, f, url, "the recovery", func(r jwksfetch.Result) bool { return r.Err == nil && r.Keys != nil })
		})
	}
}

// TestFirstFetchFails: with no last good keys, the result says why and
// has none; retries back off rather than hammer the issuer.
func TestFirstFetchFails(t *testing.T) {
	is := newIssuer(t, nil)
	is.serve(http.StatusNotFound, nil, 0)
	f, _ := started(t, is, func(o *jwksfetch.Options) {
		o.Retry, o.Refresh = 100*time.Millisecond, time.Hour
	})
	url := is.URL + "/missing"
	f.Get(url, "ns")
	res := wait(t, f, url, "the failure", func(r jwksfetch.Result) bool { return r.Err != nil })
	if res.Keys != nil || !strings.Contains(res.Err.Error(), "HTTP status 404") {
		t.Errorf("result %+v", res)
	}
	// Retries at 100, 200, 400, 800 ms...: within 1.6 s at most 5
	// requests, where a fixed 100 ms retry would make 16.
	time.Sleep(1600 * time.Millisecond)
	if n := is.requests.Load(); n > 6 {
		t.Errorf("%d requests in 1.6 s: the retries do not back off", n)
	}
}

// TestRefusedAddresses: with the default address check, the manager's own
// loopback (here: the issuer) is refused, whatever the URL names it; so is
// a plain http URL and a redirect to one.
func TestRefusedAddresses(t *testing.T) {
	k1 := testsupport.NewJWTKey("k1", jose.ES256)
	is := newIssuer(t, testsupport.JWKSet(k1))
	f, _ := started(t, is, func(o *jwksfetch.Options) { o.AllowAddr = nil })
	for _, u := range []string{is.URL + "/keys", strings.Replace(is.URL, "127.0.0.1", "localhost", 1) + "/keys"} {
		f.Get(u, "ns")
		res := wait(t, f, u, "a refusal", func(r jwksfetch.Result) bool { return r.Err != nil })
		if !strings.Contains(res.Err.Error(), "does not fetch keys from") || strings.Contains(res.Err.Error(), "127.0.0.1") || res.Keys != nil {
			t.Errorf("%s: %+v", u, res)
		}
	}
	if is.requests.Load() != 0 {
		t.Errorf("the loopback issuer was reached %d times", is.requests.Load())
	}
	// Issue 36: the cluster's own ranges (a Service, a pod, a node) were
	// public before, so a tenant's policy made the manager probe them.
	for _, a := range []string{"127.0.0.1", "::1", "169.254.169.254", "fe80::1", "0.0.0.0", "::", "::ffff:127.0.0.1", "224.0.0.1",
		"10.96.0.10", "172.16.0.1", "192.168.1.1", "100.64.3.4", "fd00::1", "::ffff:10.0.0.1"} {
		if jwksfetch.PublicAddr(netip.MustParseAddr(a)) {
			t.Errorf("PublicAddr(%s) = true", a)
		}
	}
	for _, a := range []string{"203.0.113.7", "2001:db8::1", "100.128.0.1", "172.32.0.1"} {
		if !jwksfetch.PublicAddr(netip.MustParseAddr(a)) {
			t.Errorf("PublicAddr(%s) = false", a)
		}
	}

	redirect := httptest.NewTLSServer(http.RedirectHandler("http://127.0.0.1:1/keys", http.StatusFound))
	defer redirect.Close()
	f2, _ := started(t, nil, func(o *jwksfetch.Options) {
		o.RootCAs = redirect.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	})
	f2.Get(redirect.URL, "ns")
	res := wait(t, f2, redirect.URL, "a refused redirect", func(r jwksfetch.Result) bool { return r.Err != nil })
	if !strings.Contains(res.Err.Error(), "only https is fetched") {
		t.Errorf("redirect to http: %v", res.Err)
	}
	f2.Get("http://"+redirect.Listener.Addr().String()+"/keys", "ns")
	res = wait(t, f2, "http://"+redirect.Listener.Addr().String()+"/keys", "a refused http URL", func(r jwksfetch.Result) bool { return r.Err != nil })
	if !strings.Contains(res.Err.Error(), "not an https URL") {
		t.Errorf("http URL: %v", res.Err)
	}
}

// TestForgetsUnusedURLs: a URL no policy names any more is dropped at its
// next refresh, and the number of URLs is bounded.
func TestForgetsUnusedURLs(t *testing.T) {
	is := newIssuer(t, testsupport.JWKSet(testsupport.NewJWTKey("k1", jose.ES256)))
	var inUse atomic.Bool
	inUse.Store(true)
	f, _ := started(t, is, func(o *jwksfetch.Options) {
		o.NamedBy = func(string) ([]string, error) {
			if inUse.Load() {
				return []string{"ns"}, nil
			}
			return nil, nil
		}
		o.MaxURLs = 2
	})
	f.Get(is.URL+"/a", "ns")
	f.Get(is.URL+"/b", "ns")
	if res, ok := f.Get(is.URL+"/c", "ns"); !ok || res.Err == nil || !strings.Contains(res.Err.Error(), "its limit") {
		t.Errorf("a third URL over MaxURLs 2: %+v, %v", res, ok)
	}
	wait(t, f, is.URL+"/a", "keys", func(r jwksfetch.Result) bool { return r.Keys != nil })
	inUse.Store(false)
	deadline := time.Now().Add(20 * time.Second)
	for {
		before := is.requests.Load()
		time.Sleep(500 * time.Millisecond)
		if is.requests.Load() == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unused URLs are still fetched")
		}
	}
	if _, ok := f.Get(is.URL+"/c", "ns"); ok {
		t.Error("a new URL after the unused were forgotten: a result before any fetch")
	}
}

// TestNamespaceShare: one namespace cannot take the table from the others
// (issue 36). Before, the table was first come first served: namespace
// "greedy" naming MaxURLs URLs left every other namespace an error. Now it
// gets its share; another namespace still gets its URLs, a URL another
// namespace already names is shared (and counts toward the share of each
// that names it), and a URL is forgotten only once nobody names it.
func TestNamespaceShare(t *testing.T) {
	is := newIssuer(t, testsupport.JWKSet(testsupport.NewJWTKey("k1", jose.ES256)))
	var mu sync.Mutex
	named := map[string][]string{}
	f, _ := started(t, is, func(o *jwksfetch.Options) {
		o.MaxURLs = 8
		o.MaxURLsPerNamespace = 3
		o.NamedBy = func(u string) ([]string, error) {
			mu.Lock()
			defer mu.Unlock()
			return named[u], nil
		}
	})
	name := func(ns, u string) (jwksfetch.Result, bool) {
		mu.Lock()
		named[u] = append(named[u], ns)
		mu.Unlock()
		return f.Get(u, ns)
	}
	refused := 0
	for i := range 8 {
		if res, ok := name("greedy", fmt.Sprintf("%s/greedy-%d", is.URL, i)); ok && res.Err != nil {
			if !strings.Contains(res.Err.Error(), "the policies of namespace greedy already name 3 key set URLs, its share") {
				t.Errorf("greedy's URL %d: %v", i, res.Err)
			}
			refused++
		}
	}
	if refused != 5 {
		t.Errorf("greedy was refused %d of 8 URLs, want 5 (a share of 3)", refused)
	}
	// Another namespace gets its own, and shares greedy's first.
	for _, u := range []string{is.URL + "/other", is.URL + "/greedy-0"} {
		if res, ok := name("other", u); ok && res.Err != nil && res.Keys == nil {
			t.Errorf("namespace other, %s: %v", u, res.Err)
		}
	}
	wait(t, f, is.URL+"/other", "other's keys", func(r jwksfetch.Result) bool { return r.Keys != nil })
	// greedy stops naming its first URL: other still does, so it stays.
	mu.Lock()
	named[is.URL+"/greedy-0"] = []string{"other"}
	mu.Unlock()
	deadline := time.Now().Add(20 * time.Second)
	for {
		// greedy's share frees at the URL's next refresh.
		if res, ok := f.Get(is.URL+"/greedy-9", "greedy"); !ok || res.Err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("greedy's share never freed after it stopped naming a URL")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res, ok := f.Get(is.URL+"/greedy-0", "other"); !ok || res.Keys == nil {
		t.Errorf("the URL other still names: %+v, %v", res, ok)
	}
}

// TestInternalFlag: a fetch from an address an admin allowed that is not
// public says so (Result.Internal), so that its errors stay out of a
// tenant's status; a refused address is named in no error.
func TestInternalFlag(t *testing.T) {
	is := newIssuer(t, testsupport.JWKSet(testsupport.NewJWTKey("k1", jose.ES256)))
	is.serve(http.StatusNotFound, nil, 0)
	f, _ := started(t, is, func(o *jwksfetch.Options) {
		o.AllowAddr = nil
		o.AllowedPrefixes = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	res := wait(t, f, is.URL+"/keys", "a failure", func(r jwksfetch.Result) bool { return r.Err != nil })
	if !res.Internal || !strings.Contains(res.Err.Error(), "404") {
		t.Errorf("an allowed loopback issuer's 404: %+v (want Internal, and the detail kept for the log)", res)
	}
	// The paired case: the same issuer counted public.
	g, _ := started(t, is, func(o *jwksfetch.Options) { o.Internal = func(netip.Addr) bool { return false } })
	if res := wait(t, g, is.URL+"/keys", "a failure", func(r jwksfetch.Result) bool { return r.Err != nil }); res.Internal {
		t.Errorf("a public issuer's failure marked internal: %+v", res)
	}
}
