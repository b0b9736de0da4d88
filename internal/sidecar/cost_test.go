package sidecar

import (
	"bufio"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// sseUpstream is a model server: each request streams tokens as
// Server-Sent Events, one chunk per event, then OpenAI's final usage
// event and [DONE]. A request with X-Hold waits after its first event
// until release receives (streaming must not wait for the end).
type sseUpstream struct {
	*httptest.Server
	tokens  int
	release chan struct{}
}

func newSSEUpstream(t *testing.T, tokens int) *sseUpstream {
	u := &sseUpstream{tokens: tokens, release: make(chan struct{})}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			fl.Flush()
			if i == 0 && r.Header.Get("X-Hold") != "" {
				select {
				case <-u.release:
				case <-r.Context().Done():
					return
				}
			}
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", u.tokens/3, u.tokens-u.tokens/3, u.tokens)
	}))
	t.Cleanup(u.Close)
	return u
}

var remainingParam = regexp.MustCompile(`;r=(\d+)`)

// TestCostStreamingAcrossSidecars: three sidecars on one Redis in front
// of a streaming model server; a policy of 1,000 tokens a minute charged
// from the stream's final usage event. Requests are admitted while the
// window's tokens are under the limit, each is charged its 300 tokens when
// its stream ends (the fourth puts the key 200 in debt), and the fifth is
// refused with a Retry-After within the window. The stream reaches the
// client event by event (the upstream holds its stream until the client
// has read the first event through the sidecar). Paired with the same
// limit counting requests: ten streams, 3,000 tokens, all admitted.
func TestCostStreamingAcrossSidecars(t *testing.T) {
	r := testsupport.StartRedis(t)
	for _, tc := range []struct {
		name           string
		cost           bool
		admitted, over int
	}{{"tokens", true, 4, 6}, {"requests", false, 10, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			up := newSSEUpstream(t, 300)
			pol := testPolicy("tokens-"+tc.name, 1000)
			if tc.cost {
				pol.Cost = &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}, Default: 50}}
			}
			cfg := costConfig(pol)
			var lims []enforce.Decider
			for range 3 {
				lims = append(lims, redisLimiter(t, r, 3, exactTimeout))
			}
			f := newFleet(t, lims, cfg)
			f.up.Close()
			for i := range f.sidecars {
				o := testOptions(up.URL, f.cfg, nil)
				s, err := New(o, lims[i], testLogger(t))
				if err != nil {
					t.Fatal(err)
				}
				f.fronts[i] = newTestServer(t, s).URL
			}
			admitted, over, tokens := 0, 0, 0
			for i := range 10 {
				req, _ := http.NewRequest("GET", f.fronts[i%3]+"/v1/chat/completions", nil)
				hold := i == 0
				if hold {
					req.Header.Set("X-Hold", "1")
				}
				resp, err := f.client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				switch resp.StatusCode {
				case http.StatusOK:
					admitted++
					if tc.cost {
						m := remainingParam.FindStringSubmatch(resp.Header.Get("RateLimit"))
						if want := 1000 - 300*i; m == nil || m[1] != strconv.Itoa(want) {
							t.Fatalf("request %d: RateLimit %q, want r=%d (the window's tokens so far)", i, resp.Header.Get("RateLimit"), want)
						}
					}
					br := bufio.NewReader(resp.Body)
					first, err := br.ReadString('\n')
					if err != nil || !strings.Contains(first, "tok0") {
						t.Fatalf("request %d: first event %q, %v", i, first, err)
					}
					if hold {
						close(up.release) // only now may the stream go on
					}
					rest, _ := io.ReadAll(br)
					if !strings.Contains(string(rest), "[DONE]") {
						t.Fatalf("request %d: stream cut: %q", i, rest)
					}
					tokens += 300
				case http.StatusTooManyRequests:
					over++
					ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
					if ra < 1 || ra > 60 {
						t.Fatalf("request %d: Retry-After %q, want within the minute", i, resp.Header.Get("Retry-After"))
					}
				default:
					t.Fatalf("request %d: status %d", i, resp.StatusCode)
				}
				drain(resp)
			}
			t.Logf("%d streams admitted (%d tokens), %d refused; limit 1000 tokens", admitted, tokens, over)
			if admitted != tc.admitted || over != tc.over {
				t.Fatalf("admitted %d refused %d, want %d and %d", admitted, over, tc.admitted, tc.over)
			}
			// The judge: admitted while under the limit, one stream's cost
			// may pass it (the last admitted check): never more. Counting
			// requests must fail it, or it judges nothing.
			if held := tokens <= 1000+300; held != tc.cost {
				t.Fatalf("%d tokens served under a limit of 1000 tokens (cost policy %v)", tokens, tc.cost)
			}
		})
	}
}

// TestCostGzipIsNoWayAround: a client asking for a compressed response,
// whose usage the sidecar cannot read as it streams by, is still charged
// the usage the body reports, not the policy's default: the sidecar does
// not forward its Accept-Encoding (before: charged the default of 1, so
// ten requests of 300 tokens passed a limit of 1,000).
func TestCostGzipIsNoWayAround(t *testing.T) {
	r := testsupport.StartRedis(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		body := `{"usage":{"total_tokens":300}}`
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, body)
			_ = zw.Close()
			return
		}
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(up.Close)
	pol := testPolicy("gz", 1000)
	pol.Cost = &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}, Default: 1}}
	_, front := costSidecar(t, r, up.URL, pol)
	// DisableCompression: the client's Accept-Encoding is sent as set.
	c := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	admitted := 0
	for range 10 {
		req, _ := http.NewRequest("GET", front, nil)
		req.Header.Set("Accept-Encoding", "gzip")
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			admitted++
		}
		drain(resp)
	}
	if admitted != 4 {
		t.Fatalf("%d requests of 300 tokens admitted under 1000 tokens, want 4", admitted)
	}
}

// costConfig is a config of the one policy pol, in the version its cost
// needs.
func costConfig(pol sidecarconfig.Policy) *sidecarconfig.Config {
	cfg := testConfig(nil, pol)
	cfg.Version = sidecarconfig.VersionOf(sidecarconfig.MinMinorOf(&cfg.Policies[0]))
	return cfg
}

// costSidecar is one sidecar enforcing pol on a real limiter of r, in
// front of upstream, and the URL it serves at.
func costSidecar(t *testing.T, r *testsupport.Redis, upstream string, pol sidecarconfig.Policy) (*Sidecar, string) {
	t.Helper()
	vol := newVolume(t)
	vol.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, costConfig(pol))})
	s, err := New(testOptions(upstream, vol, nil), redisLimiter(t, r, 1, exactTimeout), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	return s, newTestServer(t, s).URL
}

// chargedBy is slidegate_sidecar_cost_charged_total of policy and source.
func chargedBy(s *Sidecar, policy, source string) float64 {
	return testutil.ToFloat64(s.metrics.costCharged.WithLabelValues(policy, source))
}

// TestCostSources: where a response reports its cost, and what is charged
// when it does not, each followed by the window's tokens as the next
// request's RateLimit field reports them.
func TestCostSources(t *testing.T) {
	r := testsupport.StartRedis(t)
	type step struct {
		name    string
		handler http.HandlerFunc
		// hangUp: the client closes the stream after its first event.
		hangUp bool
		source string
		cost   int64
	}
	sse := func(usage string, hold chan struct{}) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			w.(http.Flusher).Flush()
			if hold != nil {
				<-hold // the client has hung up
			}
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n")
			if hold != nil {
				// The sidecar's flush of b to the gone client fails, its
				// write of c then too, and it stops reading before the
				// usage comes: only a drain reads it.
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"c\"}}]}\n\n")
				w.(http.Flusher).Flush()
				time.Sleep(50 * time.Millisecond)
			}
			if usage != "" {
				_, _ = io.WriteString(w, "data: "+usage+"\n\n")
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		}
	}
	hold := make(chan struct{})
	steps := []step{
		{name: "json body", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"x","usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}`)
		}, source: "body", cost: 30},
		{name: "sse stream", handler: sse(`{"usage":{"total_tokens":40}}`, nil), source: "body", cost: 40},
		{name: "header", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("X-Usage-Tokens", "50")
			_, _ = io.WriteString(w, "ok")
		}, source: "header", cost: 50},
		{name: "trailer", handler: func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Trailer", "X-Usage-Tokens")
			_, _ = io.WriteString(w, "ok")
			w.(http.Flusher).Flush()
			w.Header().Set("X-Usage-Tokens", "60")
		}, source: "trailer", cost: 60},
		{name: "no usage: the default", handler: sse("", nil), source: "default", cost: 7},
		// The client hangs up after the first event; the usage comes in
		// the stream's last event, which the sidecar still reads (before
		// the drain: the default, 7).
		{name: "client hangs up", handler: sse(`{"usage":{"total_tokens":80}}`, hold), hangUp: true, source: "body", cost: 80},
	}
	var current atomic.Pointer[http.HandlerFunc]
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*current.Load())(w, r) }))
	t.Cleanup(up.Close)
	pol := testPolicy("src", 100000)
	pol.Cost = &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{Header: "X-Usage-Tokens", JSONFields: []string{"usage.total_tokens"}, Default: 7}}
	s, front := costSidecar(t, r, up.URL, pol)
	total := int64(0)
	for _, st := range steps {
		h := st.handler
		current.Store(&h)
		before := chargedBy(s, "src", st.source)
		c := http.DefaultClient
		if st.hangUp {
			// The hang-up resets the connection (linger 0), so that the
			// sidecar's next write to it fails and it stops reading the
			// application, as it does for a client that is really gone.
			c = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
				if err == nil {
					_ = conn.(*net.TCPConn).SetLinger(0)
				}
				return conn, err
			}}}
		}
		resp, err := c.Get(front)
		if err != nil {
			t.Fatal(err)
		}
		if m := remainingParam.FindStringSubmatch(resp.Header.Get("RateLimit")); m == nil || m[1] != strconv.FormatInt(100000-total, 10) {
			t.Fatalf("%s: RateLimit %q, want r=%d", st.name, resp.Header.Get("RateLimit"), 100000-total)
		}
		if st.hangUp {
			_, _ = bufio.NewReader(resp.Body).ReadString('\n')
			_ = resp.Body.Close()
			time.Sleep(50 * time.Millisecond) // the sidecar sees the hang-up
			close(hold)
		} else {
			drain(resp)
		}
		eventually(t, 5*time.Second, st.name+": charged", func() bool {
			return chargedBy(s, "src", st.source)-before == float64(st.cost)
		})
		total += st.cost
	}
}

// TestCostHangUpEndsTheStream: a client that hangs up on a stream that
// does not end is charged what was read (here nothing: the default), and
// the request to the application ends drainMaxTime after the hang-up, not
// when the stream would have (never).
func TestCostHangUpEndsTheStream(t *testing.T) {
	old := drainMaxTime
	drainMaxTime = 300 * time.Millisecond
	t.Cleanup(func() { drainMaxTime = old })
	r := testsupport.StartRedis(t)
	ended := make(chan time.Time, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				ended <- time.Now()
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	t.Cleanup(up.Close)
	pol := testPolicy("endless", 100000)
	pol.Cost = &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}, Default: 9}}
	s, front := costSidecar(t, r, up.URL, pol)
	resp, err := http.Get(front)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	hungUp := time.Now()
	_ = resp.Body.Close()
	select {
	case at := <-ended:
		took := at.Sub(hungUp)
		t.Logf("the application's request ended %v after the hang-up (drainMaxTime %v)", took, drainMaxTime)
		if took < drainMaxTime {
			t.Fatalf("ended %v after the hang-up, before drainMaxTime %v: the usage had no chance", took, drainMaxTime)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the application's request did not end after the client hung up")
	}
	eventually(t, 5*time.Second, "charged the default", func() bool { return chargedBy(s, "endless", "default") == 9 })
}

// TestCostUpgradeChargesTheDefault: a WebSocket upgrade (101) is a tunnel
// whose usage cannot be read: it is charged the policy's default, not
// nothing, and the next request's RateLimit field counts it.
func TestCostUpgradeChargesTheDefault(t *testing.T) {
	r := testsupport.StartRedis(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			_, _ = io.WriteString(w, "ok")
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(io.Discard, brw) // until the client closes the tunnel
	}))
	t.Cleanup(up.Close)
	pol := testPolicy("ws", 100)
	pol.Cost = &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}, Default: 9}}
	s, front := costSidecar(t, r, up.URL, pol)
	req, _ := http.NewRequest(http.MethodGet, front, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: status %d", resp.StatusCode)
	}
	_ = resp.Body.Close()
	eventually(t, 5*time.Second, "charged the default for the tunnel", func() bool { return chargedBy(s, "ws", "default") == 9 })
	resp, err = http.Get(front)
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if m := remainingParam.FindStringSubmatch(resp.Header.Get("RateLimit")); m == nil || m[1] != "91" {
		t.Errorf("after the tunnel: RateLimit %q, want r=91", resp.Header.Get("RateLimit"))
	}
}

// TestCostRequestHeader: a request cost read from a header is decided as
// the request arrives (admitted only if it fits, counted at once); a
// missing, repeated or malformed header costs the default, one above 1e9
// counts 1e9; a cost of 0 is a check (admitted while under the limit).
func TestCostRequestHeader(t *testing.T) {
	r := testsupport.StartRedis(t)
	up := newUpstream(t)
	pol := testPolicy("est", 1000)
	def := int64(5)
	pol.Cost = &sidecarconfig.Cost{Request: &sidecarconfig.RequestCost{Header: "X-Estimated-Tokens", Default: &def}}
	_, front := costSidecar(t, r, up.URL, pol)
	for i, st := range []struct {
		values []string
		status int
		rem    int64 // after the decision
	}{
		{[]string{"600"}, 200, 400},
		{nil, 200, 395},             // the default
		{[]string{"1e3"}, 200, 390}, // not plain digits: the default
		{[]string{"10", "10"}, 200, 385},
		{[]string{"500"}, 429, 385}, // does not fit: nothing counted
		{[]string{"0"}, 200, 385},   // a check
		{[]string{"385"}, 200, 0},
		{[]string{"0"}, 429, 0},
		{[]string{"99999999999999999999999"}, 429, 0}, // 1e9: never fits
	} {
		req, _ := http.NewRequest("GET", front, nil)
		req.Header["X-Estimated-Tokens"] = st.values
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		if resp.StatusCode != st.status {
			t.Fatalf("step %d (%q): status %d, want %d", i, st.values, resp.StatusCode, st.status)
		}
		if st.status == 200 {
			if m := remainingParam.FindStringSubmatch(resp.Header.Get("RateLimit")); m == nil || m[1] != strconv.FormatInt(st.rem, 10) {
				t.Fatalf("step %d (%q): RateLimit %q, want r=%d", i, st.values, resp.Header.Get("RateLimit"), st.rem)
			}
		}
	}
}
