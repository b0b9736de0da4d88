package limiter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// Exact through change: the Redis behind a fleet fails over or moves a
// slot while three limiters (three sidecars, a client each) drive its hot
// keys. Each run is judged from what the application received
// (testsupport.BusiestWindow: admits sent after a−window and back by a), with
// the fleet's own measurements beside it: the decisions that reached
// clients as errors (failed closed: a 503 from the sidecar), those the
// fallback made, and how long after the change decisions were Redis's
// again.

// changeLoad drives lims with callers per limiter, each sending requests
// of clients in turn (reqs builds a request's rules), until stop.
type changeLoad struct {
	lims    []*Limiter
	reqs    func(client string) []Request
	clients []string
	callers int
	// pace, when set, is the pause after each request: callers×pace sets
	// the rate, so that admits keep coming at about a known pace around
	// the change instead of exhausting the limit at once.
	pace time.Duration

	mu       sync.Mutex
	recs     []changeRec
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// changeRec is one request: when it was sent and decided, and how.
type changeRec struct {
	client     string
	reqs       []Request
	sent, done time.Time
	out        []Decision
}

// passed reports whether the request reached the application: every rule
// that is not dry-run allowed it.
func (r *changeRec) passed() bool {
	for i, d := range r.out {
		if !d.Allowed && !r.reqs[i].DryRun {
			return false
		}
	}
	return true
}

// fromRedis reports whether Redis (or the deny cache, which repeats what
// Redis said) made every decision of the request.
func (r *changeRec) fromRedis() bool {
	for _, d := range r.out {
		if d.Source != SourceRedis && d.Source != SourceDenyCache {
			return false
		}
	}
	return true
}

func (l *changeLoad) start() {
	l.stop = make(chan struct{})
	for li, lim := range l.lims {
		for c := range l.callers {
			l.wg.Go(func() {
				for i := c; ; i++ {
					select {
					case <-l.stop:
						return
					default:
					}
					l.mu.Lock()
					client := l.clients[(i+li)%len(l.clients)]
					l.mu.Unlock()
					reqs := l.reqs(client)
					r := changeRec{client: client, reqs: reqs, sent: time.Now()}
					r.out = lim.Decide(context.Background(), reqs)
					r.done = time.Now()
					l.mu.Lock()
					l.recs = append(l.recs, r)
					l.mu.Unlock()
					if l.pace > 0 {
						time.Sleep(l.pace)
					} else if !r.passed() || !r.fromRedis() {
						// A client turned away (or failed) does not come
						// back at once: denials, answered locally by the
						// deny cache, would otherwise spin the callers and
						// starve the machine.
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
	}
}

// addClients has the callers send requests of clients too, from now on.
func (l *changeLoad) addClients(clients ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clients = append(slices.Clip(l.clients), clients...)
}

// halt stops the callers and waits for them; it may be called again.
func (l *changeLoad) halt() {
	l.stopOnce.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// first is when the first request was sent (now if none).
func (l *changeLoad) first() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.recs) == 0 {
		return time.Now()
	}
	return l.recs[0].sent
}

// count returns how many requests so far match.
func (l *changeLoad) count(match func(*changeRec) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for i := range l.recs {
		if match(&l.recs[i]) {
			n++
		}
	}
	return n
}

// waitFor polls until at least n requests match, or fails the test after d.
func (l *changeLoad) waitFor(t *testing.T, d time.Duration, n int, what string, match func(*changeRec) bool) {
	t.Helper()
	if _, ok := eventually(d, func() bool { return l.count(match) >= n }); !ok {
		t.Fatalf("waited %v for %d requests %s, saw %d; since the first: %v", d, n, what, l.count(match), l.result(l.first(), 1<<62, time.Hour))
	}
}

// fallBehind has the replica behind link receive nothing more (when there
// is a link: replicationLag > 0) and waits until n requests sent since are
// decided: whatever they admitted, the replica lacks when the master then
// fails. It is the worst moment of a lagging replica, made certain rather
// than left to the machine's timing. The caller resumes the link.
func (l *changeLoad) fallBehind(t *testing.T, link *testsupport.Proxy, n int) {
	t.Helper()
	if link == nil {
		return
	}
	link.Hold(true)
	from := time.Now()
	l.waitFor(t, 20*time.Second, n, "decided after the replica fell behind", func(r *changeRec) bool { return r.sent.After(from) })
}

// changeResult is what a run measured.
type changeResult struct {
	requests, admits int
	// excess is the most admits of one key beyond its limit in a window.
	excess int
	where  string
	// failedClosed are requests a rule failed closed (clients see an
	// error); fallback, those a rule decided locally.
	failedClosed, fallback int
	// back is how long after the change the first request sent after it
	// had Redis's decisions; lastOff, when the last one that had not ended
	// (0: none).
	back, lastOff time.Duration
	errs          map[string]int // why Redis did not decide, by error text
	// when, for each error text, the first and last time it was seen
	// (since the change).
	when map[string][2]time.Duration
}

func (r changeResult) String() string {
	var errs []string
	for e, n := range r.errs {
		w := r.when[e]
		errs = append(errs, fmt.Sprintf("%d× %s (%v to %v)", n, e, w[0].Round(time.Millisecond), w[1].Round(time.Millisecond)))
	}
	slices.Sort(errs)
	return fmt.Sprintf("%d requests, %d admitted; excess %d; %d failed closed, %d by the fallback; decisions Redis's again %v after the change, the last not Redis's %v after; errors: %s",
		r.requests, r.admits, r.excess, r.failedClosed, r.fallback, r.back.Round(time.Millisecond), r.lastOff.Round(time.Millisecond), strings.Join(errs, ", "))
}

// result judges the run: every rule of the requests has limit and window.
func (l *changeLoad) result(change time.Time, limit int, window time.Duration) changeResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	res := changeResult{requests: len(l.recs), errs: map[string]int{}, when: map[string][2]time.Duration{}, back: -1}
	var admits []testsupport.Decision
	for i := range l.recs {
		r := &l.recs[i]
		if r.passed() {
			res.admits++
			for _, q := range r.reqs {
				if !q.DryRun {
					admits = append(admits, testsupport.Decision{Key: q.Rule.ID + "/" + r.client, Sent: r.sent, Done: r.done, Admitted: true})
				}
			}
		}
		failed, fb := false, false
		for _, d := range r.out {
			failed = failed || d.Source == SourceFailedClosed
			fb = fb || d.Source == SourceFallback
			if d.Err != nil {
				e, at := errText(d.Err), r.done.Sub(change)
				w, seen := res.when[e]
				if !seen {
					w[0] = at
				}
				res.when[e] = [2]time.Duration{min(w[0], at), max(w[1], at)}
				res.errs[e]++
			}
		}
		if failed {
			res.failedClosed++
		}
		if fb {
			res.fallback++
		}
		switch {
		case !r.fromRedis() && r.done.After(change):
			res.lastOff = max(res.lastOff, r.done.Sub(change))
		case r.fromRedis() && r.sent.After(change) && (res.back < 0 || r.done.Sub(change) < res.back):
			res.back = r.done.Sub(change)
		}
	}
	if most, where := testsupport.BusiestWindow(admits, window); most > limit {
		res.excess, res.where = most-limit, where
	}
	return res
}

// errText shortens an error to its kind, for the log.
func errText(err error) string {
	s := err.Error()
	for _, sep := range []string{": dial", " 127.0.0.1", " 127.0.0.2"} {
		if i := strings.Index(s, sep); i > 0 {
			s = s[:i]
		}
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// admittedBetween counts the admits of requests sent before sentBefore
// that arrived at or after from.
func (l *changeLoad) admittedBetween(from, sentBefore time.Time) int {
	return l.count(func(r *changeRec) bool {
		return r.passed() && r.sent.Before(sentBefore) && !r.done.Before(from)
	})
}

// clusterLimiters returns n limiters on cluster c, each with its own
// client (as n sidecars).
func clusterLimiters(t *testing.T, c *testsupport.Cluster, n int, opts Options) []*Limiter {
	t.Helper()
	var lims []*Limiter
	for range n {
		lims = append(lims, newLimiter(t, clusterClient(t, c), opts))
	}
	return lims
}

// clientsInSlot returns n client names whose keys under rule lie in one
// slot, and that slot.
func clientsInSlot(prefix, rule string, n int) ([]string, int) {
	var out []string
	want := -1
	for i := 0; len(out) < n; i++ {
		c := fmt.Sprintf("hot-%d", i)
		s := redisschema.Slot(Key(prefix, rule, c))
		if want == -1 {
			want = s
		}
		if s == want {
			out = append(out, c)
		}
	}
	return out, want
}

func clusterClient(t *testing.T, c *testsupport.Cluster) redis.UniversalClient {
	return client(t, redisconn.Config{Mode: redisconn.Cluster, Addrs: c.Addrs()})
}

// uniquePrefix is a key prefix no earlier run used: the shared clusters
// outlive a run (-count=2).
func uniquePrefix(name string) string {
	return name + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
}
