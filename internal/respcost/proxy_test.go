package respcost

import (
	"bufio"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"
)

// charging is how a proxy charges a response: its Close (which
// httputil.ReverseProxy calls when the body is done, on EOF, an upstream
// error or a client that went away, and before it copies the trailers)
// takes the cost.
type charging struct {
	*Meter
	res    *http.Response
	record func(Result)
}

func (c *charging) Close() error {
	err := c.Meter.Close()
	c.record(c.Cost(c.res.Trailer))
	return err
}

// meteringProxy is a reverse proxy to upstream that sends each response's
// Result on the returned channel.
func meteringProxy(t *testing.T, spec Spec, upstream http.Handler) (*httptest.Server, <-chan Result) {
	t.Helper()
	rule, err := Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	up := httptest.NewServer(upstream)
	t.Cleanup(up.Close)
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan Result, 1)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(res *http.Response) error {
		res.Body = &charging{Meter: rule.NewMeter(res.Header, res.Body), res: res, record: func(r Result) { results <- r }}
		return nil
	}
	rp.ErrorLog = log.New(io.Discard, "", 0) // a client going away is expected here
	proxy := httptest.NewServer(rp)
	t.Cleanup(proxy.Close)
	return proxy, results
}

func waitResult(t *testing.T, results <-chan Result) Result {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(30 * time.Second):
		t.Fatal("the proxy never charged the response")
		return Result{}
	}
}

// anthropicEvents are the fixture's events, one per flush.
func anthropicEvents(t *testing.T) []string {
	evs := strings.SplitAfter(string(fixture(t, "anthropic_stream.sse")), "\n\n")
	return evs[:len(evs)-1]
}

// TestReverseProxyStreams: through httputil.ReverseProxy, each event
// reaches the client before the upstream sends the next (the upstream
// waits for the client's word, so a Meter that held bytes back would hang
// the test), unchanged, and the stream's usage is charged at its end.
func TestReverseProxyStreams(t *testing.T) {
	events := anthropicEvents(t)
	seen := make(chan struct{})
	proxy, results := meteringProxy(t, anthropicSpec, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ctSSE)
		for _, e := range events {
			_, _ = io.WriteString(w, e)
			w.(http.Flusher).Flush()
			select {
			case <-seen:
			case <-r.Context().Done():
				return
			}
		}
	}))
	// A Meter holding bytes back would leave the client waiting: fail
	// then instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, proxy.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	for i, want := range events {
		var got strings.Builder
		for !strings.HasSuffix(got.String(), "\n\n") {
			line, err := br.ReadString('\n')
			if err != nil {
				t.Fatalf("event %d: %v after %q", i, err, got.String())
			}
			got.WriteString(line)
		}
		if got.String() != want {
			t.Fatalf("event %d: got %q, want %q", i, got.String(), want)
		}
		seen <- struct{}{}
	}
	if rest, _ := io.ReadAll(br); len(rest) != 0 {
		t.Fatalf("bytes after the last event: %q", rest)
	}
	if got := waitResult(t, results); got != (Result{Cost: 25 + 15, Source: SourceBody}) {
		t.Fatalf("charged %+v", got)
	}
}

// TestReverseProxyClientGoesAway: a client that leaves mid-stream is
// charged what the stream had reported so far.
func TestReverseProxyClientGoesAway(t *testing.T) {
	events := anthropicEvents(t)
	proxy, results := meteringProxy(t, anthropicSpec, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ctSSE)
		_, _ = io.WriteString(w, events[0]) // message_start: 25 in, 1 out
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the rest never comes
	}))
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, proxy.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(res.Body).ReadString('}'); err != nil {
		t.Fatal(err)
	}
	cancel()
	res.Body.Close()
	if got := waitResult(t, results); got != (Result{Cost: 25 + 1, Source: SourceBody, Issues: IssueCut}) {
		t.Fatalf("charged %+v", got)
	}
}

// TestReverseProxyTrailer: a cost sent as a trailer after the body is
// charged, and still reaches the client.
func TestReverseProxyTrailer(t *testing.T) {
	proxy, results := meteringProxy(t, headerSpec, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ctJSON)
		w.Header().Set("Trailer", "X-Cost")
		_, _ = io.WriteString(w, `{"usage":{"total_tokens":5}}`)
		w.Header().Set("X-Cost", "12")
	}))
	res, err := http.Get(proxy.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if got := res.Trailer.Get("X-Cost"); got != "12" {
		t.Fatalf("client's trailer X-Cost %q", got)
	}
	if got := waitResult(t, results); got != (Result{Cost: 12, Source: SourceTrailer}) {
		t.Fatalf("charged %+v", got)
	}
}
