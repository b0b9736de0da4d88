package rls

import (
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidegate/slidegate/internal/rlsconfig"
)

// FuzzRequestKey fuzzes the request→key path: validation, matching and the
// client key, with no Redis. A request is either refused by validate or
// yields bounded client keys; distinct value tuples never share a key (the
// join is unambiguous), and the hits of a call stay within MaxCallHits.
//
//	go test -fuzz FuzzRequestKey ./internal/rls
func FuzzRequestKey(f *testing.F) {
	f.Add("edge", "a", "10.0.0.1", "b", "alice", uint32(0), uint64(0))
	f.Add("edge", "a", "x", "b", ":", uint32(3), uint64(1000))
	f.Add("edge", "a", "1:x", "b", "", uint32(1000), uint64(1))
	f.Add("edge", "a", "", "b", "1:", uint32(1001), uint64(0))
	f.Add("", "a", "v", "b", "v", uint32(1), uint64(0))
	f.Add("edge", "", "v", "b", strings.Repeat("v", MaxValueBytes+1), uint32(1), uint64(1<<63))
	f.Add("edge", "a", "\x00\xff{}", "b", "é", uint32(2), uint64(2))
	s := &Server{}
	ix, err := newIndex(&rlsconfig.Config{Version: rlsconfig.Version, Policies: []rlsconfig.Policy{
		pol("one", 10, time.Second, entry("a")),
		pol("three", 10, time.Second, entry("a"), entry("b")),
		pol("two", 10, time.Second, entry("a", "x"), entry("b")),
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, hits uint32, dhits uint64) {
		d2 := desc(k1, v1, k2, v2)
		if dhits > 0 {
			d2.HitsAddend = wrapperspb.UInt64(dhits)
		}
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(k1, v1), d2}}
		if validate(req) != nil {
			return
		}
		reqs, pols, descs, tooLarge := s.gather(ix, req)
		if len(descs) != 2 || len(reqs) != len(pols) || tooLarge && len(reqs) > 0 {
			t.Fatalf("%d statuses, %d requests, %d policies, too large %v", len(descs), len(reqs), len(pols), tooLarge)
		}
		var total int64
		for _, r := range reqs {
			total += r.Hits
			if r.Hits < 1 || r.Hits > MaxHits || total > MaxCallHits {
				t.Fatalf("hits %d, %d in all", r.Hits, total)
			}
			if r.Client != clientGlobal && (!strings.HasPrefix(r.Client, clientPrefix) || len(r.Client) != len(clientPrefix)+22) {
				t.Fatalf("client key %q", r.Client)
			}
		}
		// Unambiguous: moving a byte from one value to the other changes
		// the key of a policy keyed by both.
		three := ix.domains["edge"][shape([]string{"a", "b"})]
		for _, p := range three {
			if p.name != "three" || v2 == "" {
				continue
			}
			a, _ := p.matches([]string{v1, v2})
			b, _ := p.matches([]string{v1 + v2[:1], v2[1:]})
			if a == b {
				t.Fatalf("(%q, %q) and its shifted split share the key %q", v1, v2, a)
			}
		}
	})
}
