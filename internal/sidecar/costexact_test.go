package sidecar

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/ratelimitheader"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Exactness of cost limits (issue 27), judged from outside as the make
// test-exact-busy judge does (slow_test.go), weighted: three sidecars, each
// with its own limiter and Redis client, in front of a model server that
// streams each completion as Server-Sent Events token chunks and ends with
// a usage event; callers on every sidecar, two keys, every stream of its
// own size. The model server records when each stream arrived and when it
// ended; the callers, when they sent each request and when they read its
// stream's end.
//
// The bounds, per key and per sliding window:
//
//   - A request cost known when it arrives (OpDecide) is counted at the
//     decision, which lies between the request's sending and its arrival
//     at the model server. Streams sent after d−window and arrived by d
//     were decided in (d−window, d]: their tokens sum to at most the
//     limit, exactly (testsupport.BusiestWindow, weighted).
//   - A cost known from the response is checked when the request arrives
//     (admitted while the window's charged cost is under the limit, so at
//     most limit−1 in whole tokens) and charged when the response ends,
//     as Envoy's apply_on_stream_done does: the tokens sit at the charge,
//     between the model server's end of the stream and the caller's
//     reading of it (the sidecar charges before its handler returns, so
//     before the caller sees the end). In a window (t−window, t] take the
//     stream x whose check came last, at c. The window's streams charged
//     by c were charged in (t−window, c] ⊂ (c−window, c], which x's check
//     saw: they sum to at most limit−1. The others were checked by c and
//     charged after it: in flight at c. So a window holds at most
//     limit − 1 + (streams in flight at the last check) × max cost: checks
//     let the streams in flight overshoot, by design. From the record: c
//     is no earlier than the window's last sending, m; a stream whose end
//     the caller read by m was charged before c. The judge asserts, per
//     window, that the tokens of the window's streams read to their end
//     by m sum to at most limit−1, and reports the others (measured
//     concurrency, not assumed) against max cost.
//   - Paired with the same limit counting requests: the same load serves
//     many times the tokens, and fails both judges.
const (
	costExactLimit  = 1000
	costExactWindow = time.Second
	costExactMax    = 100 // the largest stream, in tokens
)

// tokenStream is one admitted stream: sent and read are the caller's,
// arrived and ended the model server's.
type tokenStream struct {
	user                       string
	tokens                     int64
	sent, arrived, ended, read time.Time
}

// tokenUpstream is a model server that streams X-Max-Tokens tokens (at
// most costExactMax) in four SSE chunks, a millisecond apart, then
// OpenAI's usage event with that total, and records each stream by
// X-Request-Id.
type tokenUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	streams map[string]*tokenStream
}

func newTokenUpstream(t *testing.T) *tokenUpstream {
	u := &tokenUpstream{streams: map[string]*tokenStream{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now()
		n, err := strconv.ParseInt(r.Header.Get("X-Max-Tokens"), 10, 64)
		if err != nil || n < 1 || n > costExactMax {
			http.Error(w, "bad X-Max-Tokens", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := range 4 {
			if i > 0 {
				time.Sleep(time.Millisecond)
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			fl.Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":0,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\ndata: [DONE]\n\n", n, n)
		fl.Flush()
		// Before the handler returns, so before the sidecar can read the
		// stream's end and charge it.
		ended := time.Now()
		u.mu.Lock()
		u.streams[r.Header.Get("X-Request-Id")] = &tokenStream{user: r.Header.Get("X-User"), tokens: n, arrived: arrived, ended: ended}
		u.mu.Unlock()
	}))
	t.Cleanup(u.Close)
	return u
}

// charged sums the costs the limiter was asked to charge.
func (rl *recordingLimiter) charged() (n int64) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	for _, c := range rl.calls {
		for _, r := range c.reqs {
			if r.Op == limiter.OpCharge {
				n += r.Hits
			}
		}
	}
	return n
}

// tokenFleet is three sidecars, each on its own limiter on r, in front of
// up with cfg.
type tokenFleet struct {
	sidecars []*Sidecar
	lims     []*recordingLimiter
	fronts   []string
	client   *http.Client
}

func newTokenFleet(t *testing.T, r *testsupport.Redis, up string, pol sidecarconfig.Policy) *tokenFleet {
	t.Helper()
	cfg := testConfig(nil, pol)
	cfg.Version = sidecarconfig.VersionOf(sidecarconfig.MinMinorOf(&cfg.Policies[0]))
	vol := newVolume(t)
	vol.write(t, map[string][]byte{sidecarconfig.FileName: marshalConfig(t, cfg)})
	f := &tokenFleet{client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	t.Cleanup(f.client.CloseIdleConnections)
	for range 3 {
		lim := &recordingLimiter{Limiter: redisLimiter(t, r, 3, exactTimeout)}
		s, err := New(testOptions(up, vol, nil), lim, testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		f.sidecars = append(f.sidecars, s)
		f.lims = append(f.lims, lim)
		f.fronts = append(f.fronts, newTestServer(t, s).URL)
	}
	return f
}

func (f *tokenFleet) sources() map[string]float64 {
	return (&fleet{sidecars: f.sidecars}).sources()
}

// streamed is what a caller got: the status, the header, and when the
// stream's end was read.
type streamed struct {
	code   int
	header http.Header
	read   time.Time
}

// stream sends one completion request for user through front and reads
// its stream to the end.
func (f *tokenFleet) stream(front, id, user string, tokens int64) (streamed, error) {
	req, _ := http.NewRequestWithContext(context.Background(), "POST", front+"/v1/chat/completions", nil)
	req.Header.Set("X-User", user)
	req.Header.Set("X-Request-Id", id)
	req.Header.Set("X-Max-Tokens", strconv.FormatInt(tokens, 10))
	resp, err := f.client.Do(req)
	if err != nil {
		return streamed{}, err
	}
	body, err := io.ReadAll(resp.Body)
	sr := streamed{code: resp.StatusCode, header: resp.Header, read: time.Now()}
	_ = resp.Body.Close()
	if err == nil && sr.code == http.StatusOK && !strings.Contains(string(body), "[DONE]") {
		err = fmt.Errorf("stream %s cut: %q", id, body)
	}
	return sr, err
}

type tokenLoad struct {
	streams  []*tokenStream
	statuses map[int]int
	tokens   int64 // served
	elapsed  time.Duration
}

// tokenLoadFor runs callers on each sidecar of f for duration (16 for
// 3 s; SLIDEGATE_SLOW_CALLERS and SLIDEGATE_SLOW_SECONDS as for
// slowLoad), each request for one of two users, of 1 to costExactMax
// tokens, and returns the admitted streams with the model server's record.
func tokenLoadFor(t *testing.T, f *tokenFleet, up *tokenUpstream) *tokenLoad {
	t.Helper()
	callers, duration := 16, 3*time.Second
	if v, err := strconv.Atoi(os.Getenv("SLIDEGATE_SLOW_CALLERS")); err == nil && v > 0 {
		callers = v
	}
	if v, err := strconv.Atoi(os.Getenv("SLIDEGATE_SLOW_SECONDS")); err == nil && v > 0 {
		duration = time.Duration(v) * time.Second
	}
	var (
		mu    sync.Mutex
		sent  = map[string]*tokenStream{}
		codes = map[int]int{}
		seq   atomic.Int64
		wg    sync.WaitGroup
	)
	start := time.Now()
	for s := range f.fronts {
		for c := range callers {
			wg.Go(func() {
				for time.Since(start) < duration {
					n := seq.Add(1)
					id := strconv.FormatInt(n, 10)
					user := "user-" + strconv.Itoa(c%2)
					tokens := 1 + n*7919%costExactMax
					at := time.Now()
					code := 0
					sr, err := f.stream(f.fronts[s], id, user, tokens)
					code = sr.code
					if err != nil && code != 0 {
						t.Error(err)
					}
					mu.Lock()
					codes[code]++
					if code == http.StatusOK && err == nil {
						sent[id] = &tokenStream{sent: at, read: sr.read}
					}
					mu.Unlock()
					if code != http.StatusOK && code != http.StatusTooManyRequests {
						time.Sleep(10 * time.Millisecond)
					}
				}
			})
		}
	}
	wg.Wait()
	res := &tokenLoad{statuses: codes, elapsed: time.Since(start)}
	up.mu.Lock()
	defer up.mu.Unlock()
	for id, s := range sent {
		u, ok := up.streams[id]
		if !ok {
			t.Fatalf("stream %s admitted and read, but the model server has no record of it", id)
		}
		u.sent, u.read = s.sent, s.read
		res.streams = append(res.streams, u)
		res.tokens += u.tokens
	}
	return res
}

// decidedJudge is the bound of a cost known at arrival: the most tokens of
// one key decided in one window (streams sent after d−window, arrived by
// d) and where.
func (l *tokenLoad) decidedJudge() (int, string) {
	ds := make([]testsupport.Decision, len(l.streams))
	for i, s := range l.streams {
		ds[i] = testsupport.Decision{Key: s.user, Sent: s.sent, Done: s.arrived, Admitted: true, Cost: s.tokens}
	}
	return testsupport.BusiestWindow(ds, costExactWindow)
}

// chargeWindow is one window of charges as judged by chargedJudge.
type chargeWindow struct {
	user string
	at   time.Time // the window is (at−costExactWindow, at]
	// tokens of the streams charged in it for sure (ended at the model
	// server after at−window, read by at); seen of those read by the
	// window's last sending, which its last check saw; open streams
	// (and their tokens) not yet read then: in flight at that check.
	tokens, seen, openTokens int64
	open                     int
}

func (w chargeWindow) String() string {
	return fmt.Sprintf("%s: %d tokens charged in (%s, %s], %d of them read by its last sending; %d streams (%d tokens) in flight then",
		w.user, w.tokens, w.at.Add(-costExactWindow).Format("15:04:05.000"), w.at.Format("15:04:05.000"), w.seen, w.open, w.openTokens)
}

// chargedJudge judges a cost charged when the response ends (see the
// bounds above): every window, ending at each stream's read, per key. It
// returns the busiest window, the one with the most in flight, the one
// whose last check saw the most, and the windows whose tokens seen by
// their last check reach the limit.
func (l *tokenLoad) chargedJudge() (busiest, mostOpen, mostSeen chargeWindow, over []chargeWindow) {
	for user, ss := range l.byUser() {
		for j, end := range ss {
			w := chargeWindow{user: user, at: end.read}
			var in []*tokenStream
			var last time.Time
			for _, s := range ss[readAfter(ss, w.at.Add(-costExactWindow)) : j+1] {
				if s.ended.After(w.at.Add(-costExactWindow)) {
					in = append(in, s)
					w.tokens += s.tokens
					if s.sent.After(last) {
						last = s.sent
					}
				}
			}
			for _, s := range in {
				if s.read.After(last) {
					w.open++
					w.openTokens += s.tokens
				} else {
					w.seen += s.tokens
				}
			}
			if w.tokens > busiest.tokens {
				busiest = w
			}
			if w.open > mostOpen.open {
				mostOpen = w
			}
			if w.seen > mostSeen.seen {
				mostSeen = w
			}
			if w.seen > costExactLimit-1 {
				over = append(over, w)
			}
		}
	}
	return busiest, mostOpen, mostSeen, over
}

// checkJudge judges each check of a response cost on its own: the streams
// whose charge surely came within the window before it (ended at the
// model server after its arrival−window, read before its sending) were
// all seen by it, so their tokens sum to at most limit−1. It returns the
// most such tokens of one check, and where. Stronger than a window's
// seen tokens (which are a subset of the last check's), but it proves
// little while every caller has a stream in flight: a stream read before
// a check was sent is needed to see anything.
func (l *tokenLoad) checkJudge() (most int64, where string) {
	for _, ss := range l.byUser() {
		for _, x := range ss {
			var n int64
			// Empty when x arrived more than a window after it was sent.
			lo, hi := readAfter(ss, x.arrived.Add(-costExactWindow)), readAfter(ss, x.sent)
			for _, y := range ss[lo:max(lo, hi)] {
				if y.ended.After(x.arrived.Add(-costExactWindow)) {
					n += y.tokens
				}
			}
			if n > most {
				most = n
				where = fmt.Sprintf("%s: a stream sent at %s, arrived at %s, admitted with %d tokens charged in its window",
					x.user, x.sent.Format("15:04:05.000"), x.arrived.Format("15:04:05.000"), n)
			}
		}
	}
	return most, where
}

// byUser is each user's streams in the order they were read to the end.
func (l *tokenLoad) byUser() map[string][]*tokenStream {
	out := map[string][]*tokenStream{}
	for _, s := range l.streams {
		out[s.user] = append(out[s.user], s)
	}
	for _, ss := range out {
		slices.SortFunc(ss, func(a, b *tokenStream) int { return a.read.Compare(b.read) })
	}
	return out
}

// readAfter is the index of the first of ss (in reading order) read after
// t. A stream ends at the model server before it is read, so none read by
// t ended after it.
func readAfter(ss []*tokenStream, t time.Time) int {
	i, _ := slices.BinarySearchFunc(ss, t, func(s *tokenStream, t time.Time) int {
		if s.read.After(t) {
			return 1
		}
		return -1
	})
	return i
}

// TestCostExactAcrossSidecars judges the token sums of every sliding
// window from the model server's record (see the bounds above), for a
// request cost and a response cost, and pairs them with the same limit
// counting requests, which fails both judges. On a busy machine: make
// test-exact-busy.
func TestCostExactAcrossSidecars(t *testing.T) {
	def := int64(costExactMax)
	for _, tc := range []struct {
		name string
		cost *sidecarconfig.Cost
	}{
		{"request cost", &sidecarconfig.Cost{Request: &sidecarconfig.RequestCost{Header: "X-Max-Tokens", Default: &def}}},
		{"response cost", &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}, Default: costExactMax}}},
		{"requests counted", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testsupport.StartRedis(t)
			up := newTokenUpstream(t)
			pol := testPolicy("tokens", costExactLimit, withKey("Header", "X-User", "Deny"))
			pol.WindowMillis = costExactWindow.Milliseconds()
			pol.Cost = tc.cost
			f := newTokenFleet(t, r, up.URL, pol)
			res := tokenLoadFor(t, f, up)
			src := f.sources()
			var charged int64
			for _, l := range f.lims {
				charged += l.charged()
			}
			decided, where := res.decidedJudge()
			busiest, mostOpen, mostSeen, over := res.chargedJudge()
			t.Logf("statuses %v; sources %v; %d streams, %d tokens in %v; limit %d tokens per %v",
				res.statuses, src, len(res.streams), res.tokens, res.elapsed.Round(time.Millisecond), costExactLimit, costExactWindow)
			if tc.cost == nil || tc.cost.Request != nil {
				t.Logf("decided at arrival: busiest window %d tokens (%s)", decided, where)
			}
			if tc.cost == nil || tc.cost.Response != nil {
				t.Logf("charged at the end: busiest window %v (bound limit−1+%d×%d = %d)", busiest, busiest.open, costExactMax, costExactLimit-1+busiest.open*costExactMax)
				t.Logf("charged at the end: most in flight %v", mostOpen)
				t.Logf("charged at the end: most seen by a window's last check %v", mostSeen)
				seen, at := res.checkJudge()
				t.Logf("charged at the end: most seen by any check %d tokens (%s)", seen, at)
				if tc.cost != nil && seen > costExactLimit-1 {
					t.Errorf("a check admitted past the limit: %s", at)
				}
				if tc.cost == nil && seen <= costExactLimit-1 {
					t.Errorf("counting requests: at most %d tokens seen by a check, the judge cannot fail", seen)
				}
			}
			if src["fallback"] > 0 || src["failed-closed"] > 0 {
				for _, rl := range f.lims {
					rl.mu.Lock()
					for _, c := range rl.calls {
						for i, d := range c.ds {
							if d.Source == limiter.SourceFallback || d.Source == limiter.SourceFailedClosed {
								t.Logf("op %d of %d tokens, %v in %v: %s, %v", c.reqs[i].Op, c.reqs[i].Hits, c.begun.Format("15:04:05.000"), c.ended.Sub(c.begun), d.Source, d.Err)
							}
						}
					}
					rl.mu.Unlock()
				}
				t.Fatalf("decisions not from Redis: %v", src)
			}
			for code := range res.statuses {
				if code != http.StatusOK && code != http.StatusTooManyRequests {
					t.Fatalf("statuses %v: want admits and 429s only", res.statuses)
				}
			}
			if tc.cost != nil && res.statuses[http.StatusTooManyRequests] == 0 {
				t.Fatalf("statuses %v: the limit never bound", res.statuses)
			}
			switch tc.name {
			case "request cost":
				if decided > costExactLimit {
					t.Errorf("%d tokens decided in one window, limit %d: %s", decided, costExactLimit, where)
				}
				if charged != 0 {
					t.Errorf("%d tokens charged after the responses; a request cost is counted at once", charged)
				}
			case "response cost":
				for _, w := range over {
					t.Errorf("a check admitted past the limit: %v", w)
				}
				// Every stream was charged its usage, none twice or lost.
				if charged != res.tokens {
					t.Errorf("charged %d tokens, the model server served %d", charged, res.tokens)
				}
			default:
				// The pair: the same load and limit counting requests serves
				// many times the tokens; both judges must see it.
				if decided <= costExactLimit || len(over) == 0 {
					t.Errorf("counting requests: busiest window %d tokens, %d windows over the check's bound: the judges cannot fail", decided, len(over))
				}
			}
		})
	}
}

// TestCostDebtRetryAfterIsExact: four streams of 30, 30, 30 and 90
// tokens, 300 ms apart through the three sidecars, under 100 tokens per
// 2 s charged from the usage event: each check finds the window under the
// limit (0, 30, 60, 90), so all four stream, and their charges put the
// key 80 tokens in debt (180). The next request is refused until the
// window's cost is under the limit again: when the third stream's charge
// leaves the window (180−90 = 90), not the first's (a count's answer) —
// 600 ms apart, which the record tells apart.
//
// Exact, judged as the limiter tests judge a retry (pollRetryExact),
// through the sidecar: the limiter's RetryAfter, taken at the sidecar's
// call into it, puts the reopening within [begun, ended]+RetryAfter of
// that call, which must meet the third charge's own interval plus the
// window (the model server's end of its stream to the caller's reading of
// it); then polls through all three sidecars: none denied once the
// reopening has surely passed, none admitted before it can have come.
// Over HTTP the client sees the wait in whole seconds (Retry-After and
// the RateLimit field's t, both rounded up): the test checks they are the
// limiter's exact wait rounded up, so a client that waits them is
// admitted.
func TestCostDebtRetryAfterIsExact(t *testing.T) {
	const limit, window = 100, 2 * time.Second
	r := testsupport.StartRedis(t)
	up := newTokenUpstream(t)
	pol := testPolicy("tokens", limit, withKey("Header", "X-User", "Deny"))
	pol.WindowMillis = window.Milliseconds()
	pol.Cost = &sidecarconfig.Cost{Response: &sidecarconfig.ResponseCost{JSONFields: []string{"usage.total_tokens"}, Default: costExactMax}}
	f := newTokenFleet(t, r, up.URL, pol)

	type span struct{ lo, hi time.Time }
	var (
		user         string
		charges      []span // when each stream's charge can have been made
		rateLimits   []string
		sr           streamed
		reqs         []limiter.Request
		ds           []limiter.Decision
		begun, ended time.Time
	)
	// A starved run may take more than the window over the four streams
	// and the refusal, so that the first charge has left when the key is
	// found in debt: it tries again with another key.
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("in 5 attempts the four streams never came within one window: the machine is too starved to run this test")
		}
		user, charges, rateLimits = "debtor-"+strconv.Itoa(attempt), nil, nil
		for i, n := range []int64{30, 30, 30, 90} {
			if i > 0 {
				// 300 ms after the previous stream was read, so after its
				// charge: the charges' times are 300 ms apart at least.
				time.Sleep(300 * time.Millisecond)
			}
			id := user + "-" + strconv.Itoa(i)
			sr, err := f.stream(f.fronts[i%3], id, user, n)
			if err != nil || sr.code != http.StatusOK {
				t.Fatalf("stream %d: %d, %v", i, sr.code, err)
			}
			rateLimits = append(rateLimits, sr.header.Get("RateLimit"))
			up.mu.Lock()
			charges = append(charges, span{up.streams[id].ended, sr.read})
			up.mu.Unlock()
		}
		// In debt: refused, with the limiter's exact wait rounded up.
		var err error
		sr, err = f.stream(f.fronts[1], user+"-refused", user, 1)
		if err != nil {
			t.Fatal(err)
		}
		reqs, ds, begun, ended = f.lims[1].last()
		if !charges[0].lo.After(ended.Add(-window)) {
			t.Logf("the first charge (at %s) may have left the window by the refusal (at %s); again", charges[0].lo.Format("15:04:05.000"), ended.Format("15:04:05.000"))
			continue
		}
		break
	}
	// Each check saw the charges so far (all within the window, as all
	// came after the refusal's time less the window): 30 per stream.
	for i, got := range rateLimits {
		if want := fmt.Sprintf(`"tokens";r=%d;t=`, limit-30*i); !strings.HasPrefix(got, want) {
			t.Errorf("stream %d: RateLimit %q, want %s…", i, got, want)
		}
	}
	if sr.code != http.StatusTooManyRequests || len(ds) != 1 || ds[0].Allowed || reqs[0].Op != limiter.OpCheck {
		t.Fatalf("in debt: status %d, limiter asked %+v, answered %+v; want a refused check", sr.code, reqs, ds)
	}
	ra := ds[0].RetryAfter
	secs := strconv.FormatInt(ratelimitheader.CeilSeconds(ra), 10)
	if got := sr.header.Get("Retry-After"); got != secs {
		t.Errorf("Retry-After %q, want %s (the limiter's %v rounded up)", got, secs, ra)
	}
	if got, want := sr.header.Get("RateLimit"), `"tokens";r=0;t=`+secs; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	byLimiter := span{begun.Add(ra), ended.Add(ra)}
	byRecord := span{charges[2].lo.Add(window), charges[2].hi.Add(window)}
	for i, c := range charges {
		t.Logf("stream %d charged in [%s, %s]", i, c.lo.Format("15:04:05.000000"), c.hi.Format("15:04:05.000000"))
	}
	t.Logf("refused in [%s, %s], retry after %v (header %ss): reopens in [%s, %s]; the third charge leaves in [%s, %s]",
		begun.Format("15:04:05.000000"), ended.Format("15:04:05.000000"), ra, secs,
		byLimiter.lo.Format("15:04:05.000000"), byLimiter.hi.Format("15:04:05.000000"),
		byRecord.lo.Format("15:04:05.000000"), byRecord.hi.Format("15:04:05.000000"))
	overlap := func(a, b span) bool { return !a.lo.After(b.hi) && !b.lo.After(a.hi) }
	if !overlap(byLimiter, byRecord) {
		t.Fatalf("the limiter reopens the key in [%s, %s], but the window's cost falls under the limit in [%s, %s]",
			byLimiter.lo.Format("15:04:05.000000"), byLimiter.hi.Format("15:04:05.000000"),
			byRecord.lo.Format("15:04:05.000000"), byRecord.hi.Format("15:04:05.000000"))
	}
	// The judge tells the exact answer from a count's (when the first
	// stream leaves) and from the second stream's leaving: the charges
	// are 300 ms apart at least, and their intervals do not meet.
	for i := range 2 {
		if c := (span{charges[i].lo.Add(window), charges[i].hi.Add(window)}); overlap(c, byLimiter) {
			t.Fatalf("the limiter reopens the key when stream %d's charge leaves, in [%s, %s]",
				i, c.lo.Format("15:04:05.000"), c.hi.Format("15:04:05.000"))
		}
	}
	open := span{maxTime(byLimiter.lo, byRecord.lo), minTime(byLimiter.hi, byRecord.hi)}

	// Poll hard from shortly before the reopening until one is admitted.
	time.Sleep(time.Until(open.lo.Add(-100 * time.Millisecond)))
	var lastDenied time.Time
	for i := 0; ; i++ {
		if time.Now().After(open.hi.Add(window)) {
			t.Fatalf("nothing admitted by a window after the reopening (%s)", open.hi.Format("15:04:05.000"))
		}
		id := user + "-poll-" + strconv.Itoa(i)
		sent := time.Now()
		sr, err := f.stream(f.fronts[i%3], id, user, 1)
		if err != nil {
			t.Fatal(err)
		}
		if sr.code == http.StatusTooManyRequests {
			if sent.After(open.hi) {
				t.Fatalf("poll %d sent %v after the reopening was sure, refused (Retry-After %s)", i, sent.Sub(open.hi), sr.header.Get("Retry-After"))
			}
			lastDenied = sent
			continue
		}
		if sr.code != http.StatusOK {
			t.Fatalf("poll %d: status %d", i, sr.code)
		}
		up.mu.Lock()
		arrived := up.streams[id].arrived
		up.mu.Unlock()
		if arrived.Before(open.lo) {
			t.Fatalf("poll %d admitted: it reached the model server %v before the reopening", i, open.lo.Sub(arrived))
		}
		// 100 − 90: the fourth stream's charge is all the window holds,
		// unless (a starved poll) it had left too.
		want := `"tokens";r=10;t=`
		if sent.After(charges[3].hi.Add(window)) {
			want = `"tokens";r=100;t=`
		}
		if got := sr.header.Get("RateLimit"); !strings.HasPrefix(got, want) &&
			(!arrived.After(charges[3].lo.Add(window)) || !strings.HasPrefix(got, `"tokens";r=100;t=`)) {
			t.Errorf("first admit: RateLimit %q, want %s… (the fourth charge leaves in [%s, %s])", got, want,
				charges[3].lo.Add(window).Format("15:04:05.000000"), charges[3].hi.Add(window).Format("15:04:05.000000"))
		}
		// The same at the sidecars' calls into the limiter, which bound
		// each decision more tightly than the poll's sending and arrival.
		var lastRefused, firstAdmit time.Time
		for _, rl := range f.lims {
			rl.mu.Lock()
			for _, c := range rl.calls {
				if c.reqs[0].Op != limiter.OpCheck || !c.begun.After(ended) {
					continue
				}
				switch {
				case !c.ds[0].Allowed && c.begun.After(open.hi):
					t.Errorf("a check that began %v after the reopening was sure was refused", c.begun.Sub(open.hi))
				case !c.ds[0].Allowed:
					lastRefused = maxTime(lastRefused, c.begun)
				case c.ended.Before(open.lo):
					t.Errorf("a check was admitted %v before the reopening", open.lo.Sub(c.ended))
				case firstAdmit.IsZero() || c.ended.Before(firstAdmit):
					firstAdmit = c.ended
				}
			}
			rl.mu.Unlock()
		}
		if lastRefused.IsZero() {
			t.Logf("no poll came before the reopening (a starved machine); the first ended %v after it", firstAdmit.Sub(open.lo))
			return
		}
		// How late the first admit comes is the polling cadence (the
		// scheduler): logged, not asserted.
		t.Logf("reopening in [%s, %s] (%v wide); %d polls: the last refusal began %v before it, the first admit ended %v after its start (sent %v before it, reached the model server %v after its start)",
			open.lo.Format("15:04:05.000000"), open.hi.Format("15:04:05.000000"), open.hi.Sub(open.lo), i+1,
			open.lo.Sub(lastRefused), firstAdmit.Sub(open.lo), open.lo.Sub(lastDenied), arrived.Sub(open.lo))
		return
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
