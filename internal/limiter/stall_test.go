package limiter

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/testsupport"
)

// TestStalledProcess: the whole process is kept from running for 1.5 s,
// three times (SIGSTOP and SIGCONT from a child, as a busy node or a
// throttled container does), while 32 callers decide through a Redis that
// answers in 50 ms (so that round trips are in flight when it stops). Redis
// answered every round trip in time; the process just had not read the
// answers. No decision may fall back: each waits up to MaxTimeout (3 s),
// longer than the stall. With the socket timeouts the client had before
// (go-redis bounds a read by the earlier of the context's deadline and
// ReadTimeout, which was 1 s), every round trip in flight during a stall
// failed with "i/o timeout" and its decisions fell back (38 to 94 of ~700
// here): the naive case, which must fail.
//
// One caller alone takes the idle path (roundTripNow), which reads only
// until the decision's budget (1 s): a stall of 1.5 s passes it. Before
// resendTimedOut, such a read timed out and the decision fell back (1–2
// per run with 32 callers on a loaded machine; 2–3 of 3 stalls with one
// caller).
func TestStalledProcess(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the client's ReadTimeout and WriteTimeout; 0: redisconn's default
		callers int
		naive   bool
	}{
		{"redisconn's defaults", 0, 32, false},
		{"one caller: the idle path", 0, 1, false},
		{"naive: 1s socket timeouts", time.Second, 32, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testsupport.StartRedis(t)
			px := testsupport.StartProxy(t, r.Addr, testsupport.ProxyOptions{Delay: func(time.Time) time.Duration { return 50 * time.Millisecond }})
			cfg := redisconn.Config{Addrs: []string{px.Addr}, ReadTimeout: tc.timeout, WriteTimeout: tc.timeout}
			l := newLimiter(t, client(t, cfg), Options{})
			rule := Rule{ID: "ns/stall", Limit: 1 << 40, Window: time.Second}
			var total, fell atomic.Int64
			var mu sync.Mutex
			why := map[string]int{}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for w := range tc.callers {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						d := one(l, rule, strconv.Itoa(w))
						total.Add(1)
						if d.Source != SourceRedis {
							fell.Add(1)
							mu.Lock()
							why[fmt.Sprint(d.Err)]++
							mu.Unlock()
						}
					}
				})
			}
			time.Sleep(500 * time.Millisecond)
			pid := strconv.Itoa(os.Getpid())
			// Whether a stalled read reports its timeout or its answer
			// depends on which the runtime sees first when the process runs
			// again, so the naive case may need a few more stalls to show it
			// (on a loaded machine three were once not enough).
			stalls := 0
			for ; stalls < 3 || tc.naive && fell.Load() == 0 && stalls < 10; stalls++ {
				if out, err := exec.Command("sh", "-c", "kill -STOP "+pid+"; sleep 1.5; kill -CONT "+pid).CombinedOutput(); err != nil {
					t.Fatalf("stalling the process: %v %s", err, out)
				}
				time.Sleep(700 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			t.Logf("%d of %d decisions fell back across %d 1.5 s stalls (%v); %d read again after a late timeout", fell.Load(), total.Load(), stalls, why, l.Stats().ReadAgain)
			switch {
			case tc.naive && fell.Load() == 0:
				t.Error("with 1 s socket timeouts no decision fell back: this case cannot fail")
			case !tc.naive && fell.Load() > 0:
				t.Errorf("%d decisions fell back while Redis answered in 50 ms", fell.Load())
			}
		})
	}
}
