package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A Calendar divides time into the periods of a quota (Rule.Calendar): at
// most Limit admits per period. A calendar day or month has no fixed
// length (23 to 25 hours across a daylight-saving change, 28 to 31 days),
// so a quota is not a sliding window: each period is counted apart, in one
// counter per client, whose count is exact for the period whatever the
// limit (O(1) memory where a log of 10^7 admits is not affordable).
type Calendar interface {
	// Period returns the period that holds t: start <= t < end. Periods
	// tile time: the end of one is the start of the next.
	Period(t time.Time) (start, end time.Time)
}

// CalendarUnit is the length of a calendar's periods.
type CalendarUnit string

// The calendar units.
const (
	// Day is a calendar day: from midnight to midnight in the calendar's
	// time zone.
	Day CalendarUnit = "Day"
	// Month is a calendar month: from the first's midnight to the next
	// first's, in the calendar's time zone.
	Month CalendarUnit = "Month"
)

// NewCalendar returns the calendar of unit in loc (nil means UTC).
func NewCalendar(unit CalendarUnit, loc *time.Location) (Calendar, error) {
	if loc == nil {
		loc = time.UTC
	}
	switch unit {
	case Day, Month:
		return zoneCalendar{unit: unit, loc: loc}, nil
	}
	return nil, fmt.Errorf("limiter: calendar unit %q (want %s or %s)", unit, Day, Month)
}

// zoneCalendar is a Calendar of days or months in a time zone.
type zoneCalendar struct {
	unit CalendarUnit
	loc  *time.Location
}

// Period returns the day or month of t in c's zone, from the first
// instant of its first date to the first instant of the next period's.
func (c zoneCalendar) Period(t time.Time) (start, end time.Time) {
	y, m, d := t.In(c.loc).Date()
	if c.unit == Month {
		return firstInstant(y, m, 1, c.loc), firstInstant(y, m+1, 1, c.loc)
	}
	return firstInstant(y, m, d, c.loc), firstInstant(y, m, d+1, c.loc)
}

// firstInstant is the first instant whose date in loc is y-m-d (normalized
// as time.Date does) or later: its midnight, but where a change of offset
// skips midnight (Chile's, at the start of its summer time) the change,
// and where midnight comes twice (Cuba's, at its end) the first. time.Date
// guarantees neither (it read Chile's skipped midnight as 23:00 of the
// day before, so a day ended before its last hour), and periods that do
// not contain their instants would count an admit in the wrong key.
func firstInstant(y int, m time.Month, d int, loc *time.Location) time.Time {
	c := time.Date(y, m, d, 0, 0, 0, 0, loc)
	want := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	reached := func(t time.Time) bool {
		ty, tm, td := t.In(loc).Date()
		return !time.Date(ty, tm, td, 0, 0, 0, 0, time.UTC).Before(want)
	}
	if reached(c) && !reached(c.Add(-time.Second)) {
		return c // the common case: midnight, once
	}
	// Offsets change by less than 4 hours at once: the first instant is
	// within 4 hours of c, and changes fall on whole seconds.
	lo, hi := c.Add(-4*time.Hour).Unix(), c.Add(4*time.Hour).Unix()
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if reached(time.Unix(mid, 0)) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return time.Unix(hi, 0).In(loc)
}

func (c zoneCalendar) String() string { return string(c.unit) + " in " + c.loc.String() }

// inPeriods returns reqs with each calendar rule's request placed in the
// period that holds at (zero: now on Redis's clock, as far as this process
// knows it from the last reply): its Window is the period's length and its
// key names the period's start. The script checks that the period holds
// its own clock's now, and counts nothing otherwise (the reply's field is
// staleField; see redisschema's decideScript), so this guess never
// decides. reqs is copied when it has a calendar rule (it is the
// caller's; calendar true), and returned as it is otherwise.
func (l *Limiter) inPeriods(reqs []Request, at time.Time) (placed []Request, calendar bool) {
	var out []Request
	for i := range reqs {
		cal := reqs[i].Rule.Calendar
		if cal == nil {
			continue
		}
		if out == nil {
			out = append([]Request(nil), reqs...)
		}
		r := &out[i]
		t := at
		if t.IsZero() {
			t = l.redisNow()
		}
		start, end := cal.Period(t)
		r.Rule.Window = end.Sub(start)
		r.period = start.UnixMilli()
	}
	if out == nil {
		return reqs, false
	}
	return out, true
}

// ErrNoQuotas is the error of a decision with a calendar rule that
// Redis's slidegate library refused: it predates quotas (a manager of
// this release loads the one that has them when it starts). The rule's
// fail mode decides such a request; the circuit breaker does not count it
// as Redis failing, so the other rules keep going to Redis.
var ErrNoQuotas = errors.New("limiter: the slidegate library on this Redis predates quotas")

// quotasUnknown wraps err with ErrNoQuotas when it is a library's refusal
// of o's calendar keys (an older decide function takes flag 16 for out of
// range).
func quotasUnknown(o *op, err error) error {
	if o.script != &decideLua || !strings.Contains(err.Error(), "decide argument out of range") {
		return err
	}
	_, _, keys := decideKeys(o.args)
	for _, k := range keys {
		if k.flags&flagCalendar != 0 {
			return fmt.Errorf("%w: %w", ErrNoQuotas, err)
		}
	}
	return err
}

// staleField is the field of a calendar key's reply when the key named a
// period that did not hold Redis's clock.
const staleField = -1

// redisNow is this process's best guess at Redis's clock: its own, moved
// by how far ahead Redis's was in the last reply to a decision with a
// calendar rule.
func (l *Limiter) redisNow() time.Time {
	if l.guessNow != nil {
		return l.guessNow()
	}
	return time.Now().Add(time.Duration(l.redisAhead.Load()))
}

// sawRedisTime records Redis's clock from a reply (µs since scoreEpoch)
// that arrived by now.
func (l *Limiter) sawRedisTime(us int64, now time.Time) {
	l.redisAhead.Store(int64(serverTime(us).Sub(now)))
}

// periodSuffix is what a calendar rule's key carries after its variant:
// "." and the period's start in Unix ms (a variant has no '.', so the
// script finds the start as the digits after the key's last '.').
func periodSuffix(startMs int64) string {
	return "." + strconv.FormatInt(startMs, 10)
}
