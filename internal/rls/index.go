package rls

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidegate/slidegate/internal/enforce"
	"github.com/slidegate/slidegate/internal/limiter"
	"github.com/slidegate/slidegate/internal/ratelimitheader"
	"github.com/slidegate/slidegate/internal/rlsconfig"
	"github.com/slidegate/slidegate/internal/sidecarconfig"
)

// policy is one config policy compiled for matching and answering.
type policy struct {
	id        string
	namespace string
	name      string
	values    []string // per entry; "" matches any value
	rule      limiter.Rule
	dryRun    bool
	// chargedAfter: a cost policy whose cost the gateway charges after the
	// response (spec.cost.response: Envoy's apply_on_stream_done call),
	// whose descriptors with a hits_addend above 0 are charges.
	chargedAfter bool
	// nameItem and policyItem are the header items (see ratelimitheader);
	// the policy is named "<namespace>/<name>" there, a gateway serving
	// many namespaces.
	nameItem   string
	policyItem string
	limit      *rlsv3.RateLimitResponse_RateLimit // current_limit of a status
	// counters are its request series, bound when it is loaded
	// (Server.bindCounters), not looked up per decision.
	counters enforce.Counters
	// windows are its additional windows (additionalLimits), each a copy
	// of the policy with its own rule (a Variant: its own keys, in the
	// policy's slot), header items and current_limit, and of set to the
	// policy: a descriptor's call asks about all of them together, and
	// their outcomes count as the policy's.
	windows []*policy
	of      *policy
}

// policies calls f with every policy of ix.
func (ix *index) policies(f func(*policy)) {
	for _, shapes := range ix.domains {
		for _, ps := range shapes {
			for _, p := range ps {
				f(p)
			}
		}
	}
}

// index is a loaded config: per domain, per descriptor shape (its keys in
// order), the policies of that shape. A descriptor is matched with one
// map lookup and a value check per policy of its exact shape, never by a
// scan over all policies.
type index struct {
	domains map[string]map[string][]*policy
	// cfg and revision are the document in force (rlsconfig.Revision of its
	// bytes), which the admin port reports at rlsconfig.LoadedPath.
	cfg      *rlsconfig.Config
	revision string
}

func newIndex(c *rlsconfig.Config) (*index, error) {
	ix := &index{domains: map[string]map[string][]*policy{}, cfg: c}
	for i := range c.Policies {
		p := &c.Policies[i]
		keys := make([]string, len(p.Descriptor))
		cp := &policy{
			id: p.ID, namespace: p.Namespace, name: p.Name,
			values: make([]string, len(p.Descriptor)),
			rule: limiter.Rule{
				ID: p.ID, Limit: p.Limit, Window: time.Duration(p.WindowMillis) * time.Millisecond,
				Algorithm: limiter.Algorithm(p.Algorithm), FailMode: limiter.FailMode(p.FailMode),
				Durable:  p.Durability == rlsconfig.DurabilityReplicated,
				Weighted: p.Cost != nil,
			},
			chargedAfter: p.Cost != nil && p.Cost.Response != nil,
			dryRun:       p.Mode == sidecarconfig.ModeDryRun,
			nameItem:     ratelimitheader.String(p.Namespace + "/" + p.Name),
		}
		for j, e := range p.Descriptor {
			keys[j], cp.values[j] = e.Key, e.Value
		}
		cp.policyItem = ratelimitheader.PolicyItem(cp.nameItem, p.Limit, cp.rule.Window)
		cp.limit = currentLimit(p.Namespace+"/"+p.Name, p.Limit, cp.rule.Window)
		for _, l := range p.AdditionalLimits {
			w := *cp
			w.of = cp
			w.rule.Limit, w.rule.Window, w.rule.Variant = l.Limit, time.Duration(l.WindowMillis)*time.Millisecond, l.Variant()
			name := l.ItemName(p.Namespace + "/" + p.Name)
			w.nameItem = ratelimitheader.String(name)
			w.policyItem = ratelimitheader.PolicyItem(w.nameItem, l.Limit, w.rule.Window)
			w.limit = currentLimit(name, l.Limit, w.rule.Window)
			cp.windows = append(cp.windows, &w)
		}
		for _, q := range p.Quotas {
			// A quota is asked with the policy as its windows are, as in the
			// sidecar: a copy with a calendar rule (the limiter sets its
			// window to the period's length), items of its own
			// ("ns/api/day"), no w in its policy item.
			loc, err := q.Location()
			if err != nil {
				return nil, fmt.Errorf("policy %s: quota %s: %w", p.ID, q.Period, err)
			}
			cal, err := limiter.NewCalendar(limiter.CalendarUnit(q.Period), loc)
			if err != nil {
				return nil, fmt.Errorf("policy %s: %w", p.ID, err)
			}
			w := *cp
			w.of = cp
			w.rule.Limit, w.rule.Window, w.rule.Algorithm = q.Limit, 0, limiter.SlidingLog
			w.rule.Calendar, w.rule.Variant = cal, q.Variant()
			name := q.ItemName(p.Namespace + "/" + p.Name)
			w.nameItem = ratelimitheader.String(name)
			w.policyItem = ratelimitheader.PolicyItem(w.nameItem, q.Limit, 0)
			w.limit = quotaLimit(name, q)
			cp.windows = append(cp.windows, &w)
		}
		shapes := ix.domains[p.Domain]
		if shapes == nil {
			shapes = map[string][]*policy{}
			ix.domains[p.Domain] = shapes
		}
		s := shape(keys)
		shapes[s] = append(shapes[s], cp)
	}
	return ix, nil
}

// quotaLimit expresses quota q as Envoy's RateLimit: DAY or MONTH, the
// calendar's own units. requests_per_unit is 32 bits: a limit above it is
// reported as its largest value (the headers carry the exact one).
func quotaLimit(name string, q rlsconfig.Quota) *rlsv3.RateLimitResponse_RateLimit {
	unit := rlsv3.RateLimitResponse_RateLimit_DAY
	if q.Period == sidecarconfig.QuotaMonth {
		unit = rlsv3.RateLimitResponse_RateLimit_MONTH
	}
	return &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(q.Limit, 1<<32-1)), Unit: unit} //nolint:gosec // bounded
}

// shape joins keys unambiguously: each is length-prefixed.
func shape(keys []string) string {
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
	}
	return b.String()
}

// match returns the policies of domain that count a descriptor with these
// entries, with the client key of each.
func (ix *index) match(shapes map[string][]*policy, keys, values []string, out []matched) []matched {
	for _, p := range shapes[shape(keys)] {
		if m, ok := p.matches(values); ok {
			out = append(out, matched{p: p, client: m})
		}
	}
	return out
}

type matched struct {
	p      *policy
	client string
}

// matches checks the values of a descriptor of p's shape and returns its
// client key: the values of the entries without a policy value, joined
// unambiguously and hashed (they may be credentials, e.g. an API key
// header, and a hash is bounded and safe in a Redis key); "global" when
// every entry has a value.
func (p *policy) matches(values []string) (string, bool) {
	h := sha256.New()
	var n [20]byte
	any := false
	for i, want := range p.values {
		if want != "" {
			if values[i] != want {
				return "", false
			}
			continue
		}
		any = true
		// Length-prefixed, so ("a:b","c") and ("a","b:c") differ.
		h.Write(strconv.AppendInt(n[:0], int64(len(values[i])), 10))
		h.Write([]byte{':'})
		h.Write([]byte(values[i]))
	}
	if !any {
		return clientGlobal, true
	}
	var sum [sha256.Size]byte
	return clientPrefix + base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0])[:16]), true
}

// Client keys: a hash of the client's descriptor values, or the one bucket
// of a policy whose entries all have values.
const (
	clientPrefix = "d:"
	clientGlobal = "global"
)

// Units of current_limit, largest first. MONTH and YEAR have no fixed
// length and are never used.
var units = []struct {
	d    time.Duration
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{7 * 24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
	{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// currentLimit expresses a sliding window as Envoy's RateLimit: the largest
// unit that divides the window, times unit_multiplier (2m30s: 150 SECOND).
// A window that is not whole seconds is rounded up to whole seconds, like
// the w= of RateLimit-Policy (1500ms: 2 SECOND); the limit itself is exact.
// A limit above uint32 cannot occur (the config bounds it far below).
func currentLimit(name string, limit int64, window time.Duration) *rlsv3.RateLimitResponse_RateLimit {
	secs := ratelimitheader.CeilSeconds(window)
	w := time.Duration(secs) * time.Second
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(limit, 1<<32-1))} //nolint:gosec // bounded
	for _, u := range units {
		if w%u.d == 0 {
			rl.Unit = u.unit
			if m := w / u.d; m != 1 {
				rl.UnitMultiplier = wrapUint32(uint32(m)) //nolint:gosec // at most a year of seconds
			}
			break
		}
	}
	return rl
}
