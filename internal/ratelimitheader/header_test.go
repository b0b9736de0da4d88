package ratelimitheader

import (
	"testing"
	"time"
)

func TestItems(t *testing.T) {
	name := String(`ns/a"b\c` + "\x01é")
	if want := `"ns/a\"b\\c???"`; name != want {
		t.Fatalf("String: %s, want %s", name, want)
	}
	if got := PolicyItem(`"p"`, 100, 1500*time.Millisecond); got != `"p";q=100;w=2` {
		t.Errorf("PolicyItem: %s", got)
	}
	if got := string(AppendItem([]byte("x, "), `"p"`, -3, 1001*time.Millisecond)); got != `x, "p";r=0;t=2` {
		t.Errorf("AppendItem: %s", got)
	}
	for d, want := range map[time.Duration]string{0: "1", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2"} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %s, want %s", d, got, want)
		}
	}
}

func TestDeniedItem(t *testing.T) {
	// Nothing remains however the wait is rounded: t is the wait in whole
	// seconds, rounded up so that a client retrying at t is admitted.
	if got := DeniedItem(`"p"`, 1001*time.Millisecond); got != `"p";r=0;t=2` {
		t.Errorf("DeniedItem: %s", got)
	}
}

// TestFields covers the joining of both fields; new cases go at the end.
func TestFields(t *testing.T) {
	type policy struct {
		name      string
		limit     int64
		remaining int64
		reset     time.Duration
	}
	a := policy{`"a"`, 10, 7, 30 * time.Second}
	b := policy{`"b"`, 5, 0, 1500 * time.Millisecond}
	c := policy{`"c"`, 1, -1, 0}
	tests := []struct {
		name                 string
		policies             []policy
		wantPolicy, wantRate string
	}{
		{"none", nil, "", ""},
		{"one", []policy{a}, `"a";q=10;w=60`, `"a";r=7;t=30`},
		{"two, in the order added", []policy{b, a}, `"b";q=5;w=60, "a";q=10;w=60`, `"b";r=0;t=2, "a";r=7;t=30`},
		{"three", []policy{a, b, c}, `"a";q=10;w=60, "b";q=5;w=60, "c";q=1;w=60`, `"a";r=7;t=30, "b";r=0;t=2, "c";r=0;t=0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f Fields
			for _, p := range tt.policies {
				f.Add(p.name, PolicyItem(p.name, p.limit, time.Minute), p.remaining, p.reset)
			}
			if f.Len() != len(tt.policies) {
				t.Errorf("Len = %d, want %d", f.Len(), len(tt.policies))
			}
			if got := f.Policy(); got != tt.wantPolicy {
				t.Errorf("Policy = %s, want %s", got, tt.wantPolicy)
			}
			if got := f.RateLimit(); got != tt.wantRate {
				t.Errorf("RateLimit = %s, want %s", got, tt.wantRate)
			}
		})
	}
}
