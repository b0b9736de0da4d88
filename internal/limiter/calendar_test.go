package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/redisconn"
	"github.com/slidegate/slidegate/internal/redisschema"
	"github.com/slidegate/slidegate/internal/testsupport"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("time zone %s: %v", name, err)
	}
	return loc
}

// TestCalendarPeriods: days and months in zones with daylight-saving
// changes, read with an injected instant every 20 minutes of 2026. Every
// period holds its instant, periods tile, and their lengths are the
// calendar's: a month with a change is an hour short or long, and Chile's
// and Cuba's changes at midnight (which time.Date reads as the day before)
// still make a 23-hour day that starts at the change, and Cuba's repeated
// midnight a 25-hour day.
func TestCalendarPeriods(t *testing.T) {
	for _, tc := range []struct {
		zone string
		unit CalendarUnit
		// want: the length of the period that starts on each date named
		// (local, yyyy-mm-dd); every other day is 24 h.
		want map[string]time.Duration
	}{
		{"UTC", Month, map[string]time.Duration{"2026-02-01": 28 * 24 * time.Hour, "2026-03-01": 31 * 24 * time.Hour}},
		{"America/New_York", Month, map[string]time.Duration{"2026-03-01": 31*24*time.Hour - time.Hour, "2026-11-01": 30*24*time.Hour + time.Hour, "2026-12-01": 31 * 24 * time.Hour}},
		{"Europe/Berlin", Month, map[string]time.Duration{"2026-03-01": 31*24*time.Hour - time.Hour, "2026-10-01": 31*24*time.Hour + time.Hour}},
		{"Europe/Berlin", Day, map[string]time.Duration{"2026-03-29": 23 * time.Hour, "2026-10-25": 25 * time.Hour}},
		{"America/New_York", Day, map[string]time.Duration{"2026-03-08": 23 * time.Hour, "2026-11-01": 25 * time.Hour}},
		{"America/Santiago", Day, map[string]time.Duration{"2026-04-04": 25 * time.Hour, "2026-09-06": 23 * time.Hour}},
		{"America/Havana", Day, map[string]time.Duration{"2026-03-08": 23 * time.Hour, "2026-11-01": 25 * time.Hour}},
		{"Australia/Lord_Howe", Day, map[string]time.Duration{"2026-04-05": 24*time.Hour + 30*time.Minute, "2026-10-04": 23*time.Hour + 30*time.Minute}},
	} {
		t.Run(tc.zone+"/"+string(tc.unit), func(t *testing.T) {
			loc := mustZone(t, tc.zone)
			cal, err := NewCalendar(tc.unit, loc)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]time.Duration{}
			var prevEnd time.Time
			for at := time.Date(2026, 1, 1, 0, 0, 0, 0, loc); at.Year() < 2027 || at.In(loc).Year() < 2027; at = at.Add(20 * time.Minute) {
				start, end := cal.Period(at)
				if at.Before(start) || !at.Before(end) {
					t.Fatalf("%v: period [%v, %v) does not hold it", at, start, end)
				}
				if s2, e2 := cal.Period(start); !s2.Equal(start) || !e2.Equal(end) {
					t.Fatalf("%v: its start %v is in [%v, %v), another period", at, start, s2, e2)
				}
				if !prevEnd.IsZero() && !start.Equal(prevEnd) && start.After(prevEnd) {
					t.Fatalf("gap between %v and %v", prevEnd, start)
				}
				prevEnd = end
				seen[start.In(loc).Format(time.DateOnly)] = end.Sub(start)
			}
			for date, got := range seen {
				want, named := tc.want[date]
				if !named {
					if tc.unit == Month {
						continue // the months not named are checked by tiling
					}
					want = 24 * time.Hour
				}
				if got != want {
					t.Errorf("period from %s: %v, want %v", date, got, want)
				}
			}
			for date := range tc.want {
				if _, ok := seen[date]; !ok {
					t.Errorf("no period starts on %s", date)
				}
			}
		})
	}
}

// TestCalendarMidnightNaive: time.Date alone, what TestCalendarPeriods
// guards against, reads Chile's skipped midnight as 23:00 of the day
// before, so that day's period would end an hour before its last instant.
func TestCalendarMidnightNaive(t *testing.T) {
	loc := mustZone(t, "America/Santiago")
	last := time.Date(2026, 9, 5, 23, 30, 0, 0, loc) // the day's last hour
	naiveEnd := time.Date(2026, 9, 6, 0, 0, 0, 0, loc)
	if naiveEnd.After(last) {
		t.Skipf("time.Date now reads Chile's skipped midnight as %v: the naive period holds its last hour", naiveEnd)
	}
	cal, _ := NewCalendar(Day, loc)
	if _, end := cal.Period(last); !end.After(last) {
		t.Errorf("%v: period ends at %v", last, end)
	}
}

// everyCalendar has periods of a fixed length, aligned to Unix time: the
// quota tests' short stand-in for a day.
type everyCalendar struct{ d time.Duration }

func (c everyCalendar) Period(t time.Time) (time.Time, time.Time) {
	s := t.Truncate(c.d)
	return s, s.Add(c.d)
}

func (c everyCalendar) of(t time.Time) (time.Time, time.Time) { return c.Period(t) }

func quotaRule(d time.Duration, limit int64) Rule {
	return Rule{ID: "shop/api", Limit: limit, Calendar: everyCalendar{d}, Variant: "day", FailMode: FailClosed}
}

// untilInPeriod sleeps until at least lead into a period of cal with at
// least room of it left, and returns that period.
func untilInPeriod(cal everyCalendar, lead, room time.Duration) (time.Time, time.Time) {
	for {
		now := time.Now()
		s, e := cal.Period(now)
		switch {
		case now.Before(s.Add(lead)):
			time.Sleep(s.Add(lead).Sub(now))
		case e.Sub(now) < room:
			time.Sleep(e.Sub(now) + lead)
		default:
			return s, e
		}
	}
}

// TestQuotaCountsAPeriod: a quota admits its limit in a period, then
// denies until the period's end, and starts afresh in the next, in a key
// per period that expires with it; standalone and on a Cluster.
func TestQuotaCountsAPeriod(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			rdb := windowClients(t, mode)[0]
			prefix := "q" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Prefix: prefix})
			rule := quotaRule(2*time.Second, 3)
			cal := rule.Calendar.(everyCalendar)
			ctx := context.Background()
			for round := range 2 {
				s, e := untilInPeriod(cal, 20*time.Millisecond, time.Second)
				for i := range 3 {
					d := l.Decide(ctx, []Request{{Rule: rule, Client: "c"}})[0]
					if !d.Allowed || d.Remaining != int64(2-i) || d.Source != SourceRedis {
						t.Fatalf("round %d admit %d: %+v", round, i, d)
					}
				}
				d := l.Decide(ctx, []Request{{Rule: rule, Client: "c"}})[0]
				left := time.Until(e)
				if d.Allowed || d.RetryAfter > e.Sub(s) || d.RetryAfter < left-50*time.Millisecond {
					t.Fatalf("round %d: the fourth %+v, want a denial until the period's end (%v away)", round, d, left)
				}
				key := l.keyOf(&Request{Rule: Rule{ID: rule.ID, Variant: rule.Variant, Calendar: cal}, Client: "c", period: s.UnixMilli()})
				n, err := rdb.HGet(ctx, key, "0").Int64()
				if err != nil || n != 3 {
					t.Fatalf("key %s: %d, %v; want 3 admits", key, n, err)
				}
				if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > time.Until(e)+time.Second+100*time.Millisecond {
					t.Errorf("key %s lives %v, want the period's rest (%v) and the margin", key, ttl, time.Until(e))
				}
				if redisschema.Slot(key) != redisschema.Slot(l.keyOf(&Request{Rule: Rule{ID: rule.ID}, Client: "c"})) {
					t.Errorf("key %s: not in the slot of the rule's other keys", key)
				}
				time.Sleep(time.Until(e)) // the next round is in the next period
			}
		})
	}
}

// TestQuotaStalePeriodCountsNothing: a key that names a period other than
// the one Redis's clock is in counts nothing and is denied (the caller
// asks again); Decide then asks in Redis's period and admits.
func TestQuotaStalePeriodCountsNothing(t *testing.T) {
	rdb := windowClients(t, "standalone")[0]
	l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, DenyCacheMax: -1})
	rule := quotaRule(2*time.Second, 3)
	cal := rule.Calendar.(everyCalendar)
	ctx := context.Background()
	_, e := untilInPeriod(cal, 20*time.Millisecond, time.Second)
	for _, tc := range []struct {
		name  string
		guess time.Duration
	}{{"behind", -2 * time.Second}, {"ahead", 2 * time.Second}} {
		l.guessNow = func() time.Time { return time.Now().Add(tc.guess) }
		placed, _ := l.inPeriods([]Request{{Rule: rule, Client: "c-" + tc.name}}, time.Time{})
		out, stale := l.decideOnce(ctx, placed, true)
		if out[0].Allowed || stale == 0 {
			t.Errorf("%s: a key of another period: %+v, stale %d; want a denial and Redis's clock", tc.name, out[0], stale)
		}
		if tc.guess > 0 && (out[0].RetryAfter < time.Until(e)-50*time.Millisecond || out[0].RetryAfter > 2*time.Second) {
			t.Errorf("%s: retry %v, want until its period starts (%v)", tc.name, out[0].RetryAfter, time.Until(e))
		}
		if n := rdb.Exists(ctx, l.keyOf(&placed[0])).Val(); n != 0 {
			t.Errorf("%s: the other period's key was written", tc.name)
		}
		if d := l.Decide(ctx, []Request{{Rule: rule, Client: "c-" + tc.name}})[0]; !d.Allowed || d.Remaining != 2 {
			t.Errorf("%s: Decide %+v, want the first admit of Redis's period", tc.name, d)
		}
	}
}

// naiveQuota is the textbook calendar quota: the caller's clock names the
// period, and Redis counts in it (HINCRBY, then compare), with nothing to
// say the period is over.
func naiveQuota(ctx context.Context, rdb redis.UniversalClient, cal everyCalendar, now time.Time, client string, limit int64) bool {
	s, _ := cal.Period(now)
	key := fmt.Sprintf("naive:{%s}@%d", client, s.UnixMilli())
	n, err := rdb.HIncrBy(ctx, key, "0", 1).Result()
	if err != nil {
		return false
	}
	rdb.PExpire(ctx, key, time.Minute)
	if n > limit {
		rdb.HIncrBy(ctx, key, "0", -1)
		return false
	}
	return true
}

// TestQuotaCallersClock: two callers of one quota just after a period
// starts, the second's clock a second behind. The exact quota admits the
// limit in the period; the textbook one lets the late clock count in the
// period that is over, twice the limit in one period.
func TestQuotaCallersClock(t *testing.T) {
	rdbs := windowClients(t, "standalone")
	const limit = 5
	rule := quotaRule(3*time.Second, limit)
	cal := rule.Calendar.(everyCalendar)
	ctx := context.Background()
	onTime := newLimiter(t, rdbs[0], Options{Timeout: 10 * time.Second, Prefix: "qc:"})
	late := newLimiter(t, rdbs[1], Options{Timeout: 10 * time.Second, Prefix: "qc:"})
	late.guessNow = func() time.Time { return time.Now().Add(-time.Second) }
	type caller func(client string, now time.Time) bool
	exact := map[string]caller{
		"on time": func(c string, _ time.Time) bool {
			return onTime.Decide(ctx, []Request{{Rule: rule, Client: c}})[0].Allowed
		},
		"late": func(c string, _ time.Time) bool {
			return late.Decide(ctx, []Request{{Rule: rule, Client: c}})[0].Allowed
		},
	}
	naive := map[string]caller{
		"on time": func(c string, now time.Time) bool { return naiveQuota(ctx, rdbs[0], cal, now, c, limit) },
		"late": func(c string, now time.Time) bool {
			return naiveQuota(ctx, rdbs[1], cal, now.Add(-time.Second), c, limit)
		},
	}
	for _, tc := range []struct {
		name    string
		callers map[string]caller
		want    int
	}{{"exact", exact, limit}, {"naive", naive, 2 * limit}} {
		t.Run(tc.name, func(t *testing.T) {
			// Judged only when every request was sent and answered in the
			// period's first second, where the late clock is a period behind;
			// a machine too busy for that tries the next period.
			for try := 0; ; try++ {
				client := fmt.Sprintf("%s-%d", tc.name, try)
				s, _ := untilInPeriod(cal, 20*time.Millisecond, 2500*time.Millisecond)
				n := 0
				for _, who := range []string{"on time", "late"} {
					for range limit + 2 {
						if tc.callers[who](client, time.Now()) {
							n++
						}
					}
				}
				if took := time.Since(s); took >= time.Second {
					if try == 4 {
						t.Fatalf("five tries took a second or more after the period's start (last: %v)", took)
					}
					continue
				}
				if n != tc.want {
					t.Errorf("%d admits in one period, want %d", n, tc.want)
				}
				return
			}
		})
	}
}

// TestQuotaExactAcrossLimiters: three limiters whose guesses of Redis's
// clock are 120ms behind, right and 120ms ahead decide one quota of 7 per
// 400ms period for two clients under a steady load: at most 7 admits in a
// period, and no denial while a period had room; standalone and Cluster.
func TestQuotaExactAcrossLimiters(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			rdbs := windowClients(t, mode)
			rule := quotaRule(400*time.Millisecond, 7)
			cal := rule.Calendar.(everyCalendar)
			prefix := "qx" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			var lims []*Limiter
			for i, rdb := range rdbs {
				l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Prefix: prefix})
				skew := time.Duration(i-1) * 120 * time.Millisecond
				l.guessNow = func() time.Time { return time.Now().Add(skew) }
				lims = append(lims, l)
			}
			ds := testsupport.Paced(6, []string{"client-0", "client-1"}, 10*400*time.Millisecond, func(w, n int, client string) (bool, bool) {
				return lims[(w+n)%len(lims)].Decide(context.Background(), []Request{{Rule: rule, Client: client}})[0].Allowed, true
			})
			if len(ds) < 200 {
				t.Fatalf("%d requests: too few to judge", len(ds))
			}
			if most, where := testsupport.BusiestPeriod(ds, cal.of); most > int(rule.Limit) {
				t.Errorf("%d admits in one period, limit %d: %s", most, rule.Limit, where)
			}
			if wrong := testsupport.DenialsWithRoomInPeriod(ds, int(rule.Limit), cal.of); len(wrong) > 0 {
				t.Errorf("%d denials with room in their period, first: %s", len(wrong), wrong[0])
			}
			admitted := testsupport.Admitted(ds)
			if admitted == 0 || admitted == len(ds) {
				t.Errorf("%d of %d admitted: the quota never bound", admitted, len(ds))
			}
			t.Logf("%d requests, %d admitted", len(ds), admitted)
		})
	}
}

// TestQuotaDeniedElsewhereCountsNothing: a request that a quota admits
// and another rule denies is not counted in the quota: in one script
// when the keys share a slot, by the compensating undo when they do not
// (another client's key, on a Cluster).
func TestQuotaDeniedElsewhereCountsNothing(t *testing.T) {
	for _, mode := range []string{"standalone", "cluster"} {
		t.Run(mode, func(t *testing.T) {
			rdb := windowClients(t, mode)[0]
			prefix := "qu" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
			l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Prefix: prefix, DenyCacheMax: -1})
			quota := quotaRule(time.Hour, 100)
			other := Rule{ID: "shop/other", Limit: 1, Window: time.Minute}
			ctx := context.Background()
			if d := l.Decide(ctx, []Request{{Rule: other, Client: "z"}}); !d[0].Allowed {
				t.Fatalf("the other rule's first admit: %+v", d[0])
			}
			ds := l.Decide(ctx, []Request{{Rule: quota, Client: "c"}, {Rule: other, Client: "z"}})
			if !ds[0].Allowed || ds[1].Allowed {
				t.Fatalf("quota %+v, other %+v: want the quota to allow and the other to deny", ds[0], ds[1])
			}
			w, err := l.Peek(ctx, quota, "c")
			if err != nil || w.Count != 0 || w.Remaining != 100 {
				t.Errorf("the quota after a request denied elsewhere: %+v, %v; want nothing counted", w, err)
			}
		})
	}
}

// TestQuotaPeek: Peek reads a quota's period as Decide counts it.
func TestQuotaPeek(t *testing.T) {
	rdb := windowClients(t, "standalone")[0]
	l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second})
	rule := quotaRule(time.Hour, 2)
	ctx := context.Background()
	if w, err := l.Peek(ctx, rule, "c"); err != nil || !w.Allowed || w.Count != 0 || w.Remaining != 2 || w.ResetAfter != 0 {
		t.Fatalf("an unused quota: %+v, %v", w, err)
	}
	for range 2 {
		l.Decide(ctx, []Request{{Rule: rule, Client: "c"}})
	}
	_, e := rule.Calendar.Period(time.Now())
	left := time.Until(e) // before the peek: at least its retry, but for µs rounding
	w, err := l.Peek(ctx, rule, "c")
	if err != nil || w.Allowed || w.Count != 2 || w.Remaining != 0 || w.Window != time.Hour {
		t.Fatalf("a full quota: %+v, %v", w, err)
	}
	if w.RetryAfter > left+time.Millisecond || w.RetryAfter < left-time.Second || w.ResetAfter != w.RetryAfter {
		t.Errorf("retry %v and reset %v, want the period's end (%v away)", w.RetryAfter, w.ResetAfter, left)
	}
}

// TestFallbackCountsAQuota: while Redis is away a quota is counted in the
// fallback's counter mode, whatever its limit: a log of one entry per
// admit, as a SlidingLog rule's fallback keeps, would grow with a limit of
// 10^12 until memory runs out. It enforces the replica's share over the
// period's length.
func TestFallbackCountsAQuota(t *testing.T) {
	f, _ := fakeFallback(100)
	big := quotaRule(time.Hour, MaxQuota)
	big.Window = time.Hour // as inPeriods sets it
	for i := range 10_000 {
		if d := fbDecide(f, big, "c", 2); !d.Allowed {
			t.Fatalf("admit %d of a share of %d refused: %+v", i, MaxQuota/2, d)
		}
	}
	if f.logBytes != 0 {
		t.Errorf("the fallback holds %d bytes of log for a quota, want a counter", f.logBytes)
	}
	small := quotaRule(time.Hour, 10)
	small.ID, small.Window = "shop/small", time.Hour
	n := 0
	for range 20 {
		if fbDecide(f, small, "c", 2).Allowed {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d admitted of a quota of 10 on 2 replicas, want its share 5", n)
	}
}

// TestQuotaOnAnOlderLibrary: a Redis whose slidegate library predates
// quotas (its decide function takes flag 16 for out of range) fails a
// quota's decisions by their fail mode, with ErrNoQuotas, and the circuit
// breaker does not take them for Redis failing: the other rules' requests
// still go to Redis. Counted as failures, 20 of them would open the
// breaker and send every rule to the fallback.
func TestQuotaOnAnOlderLibrary(t *testing.T) {
	rdb := client(t, redisconn.Config{Addrs: []string{testsupport.StartRedis(t).Addr}})
	older := strings.Replace(redisschema.LibrarySource(),
		"if f and f >= 16 and ((f ~= 16 and f ~= 18) or not qstart(KEYS[i])) then f = nil end",
		"if f and f >= 16 then f = nil end", 1)
	if older == redisschema.LibrarySource() {
		t.Fatal("the decide function's check of flag 16 moved: update this test")
	}
	if err := rdb.FunctionLoadReplace(context.Background(), older).Err(); err != nil {
		t.Fatal(err)
	}
	l := newLimiter(t, rdb, Options{Timeout: 10 * time.Second, Functions: true})
	quota := quotaRule(time.Hour, 1000)
	quota.FailMode = FailOpen
	plain := Rule{ID: "shop/plain", Limit: 100, Window: time.Minute}
	ctx := context.Background()
	for i := range 20 {
		d := l.Decide(ctx, []Request{{Rule: quota, Client: "c"}})[0]
		if !errors.Is(d.Err, ErrNoQuotas) || d.Source != SourceFallback || !d.Allowed {
			t.Fatalf("quota decision %d: %+v, want the fallback's admit for ErrNoQuotas", i, d)
		}
	}
	if !l.Healthy() {
		t.Error("the breaker opened for a library older than quotas")
	}
	if d := l.Decide(ctx, []Request{{Rule: plain, Client: "c"}})[0]; d.Source != SourceRedis || !d.Allowed {
		t.Errorf("a plain rule beside them: %+v, want Redis's answer", d)
	}
}
