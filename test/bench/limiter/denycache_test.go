package main

import (
	"strings"
	"testing"
)

// TestParseDenyCache: `go test -bench` lines, with and without the
// GOMAXPROCS suffix, become case → variant → unit → value, and the section
// written from them carries the ratios and goals.
func TestParseDenyCache(t *testing.T) {
	out := `goos: linux
BenchmarkViewUnderAttack/put/size=1000/before-2         	  106837	     13275 ns/op	  41722 p99-ns	  50000 p999-ns	      31 B/op	       0 allocs/op
BenchmarkViewUnderAttack/put/size=1000/after-2          	 6589422	       199.4 ns/op	  170.0 p99-ns	  300 p999-ns	       0 B/op	       0 allocs/op
BenchmarkViewUnderAttack/put/size=10000/before          	    5949	    210835 ns/op	 459945 p99-ns	 500000 p999-ns	     485 B/op	       0 allocs/op
BenchmarkViewUnderAttack/put/size=10000/after           	 7724718	       325.4 ns/op	  311.0 p99-ns	  400 p999-ns	       0 B/op	       0 allocs/op
BenchmarkViewUnderAttack/put/size=100000/after-2        	 1770104	       767.9 ns/op	  751.0 p99-ns	  900 p999-ns	       2 B/op	       0 allocs/op
BenchmarkViewUnderAttack/lookup/before-2                	 4496292	       475.2 ns/op	       1 B/op	       0 allocs/op
BenchmarkViewUnderAttack/lookup/after-2                 	 5946824	       229.5 ns/op	       0 B/op	       0 allocs/op
BenchmarkViewUnderAttack/mixed/callers=64/before-2      	    7696	    220717 ns/op	     519 B/op	       0 allocs/op
BenchmarkViewUnderAttack/mixed/callers=64/after-2       	 1000000	      1119 ns/op	       2 B/op	       0 allocs/op
BenchmarkViewUnderAttack/mixed/callers=64/after-sharded16-2         	 1000000	      1148 ns/op	       2 B/op	       0 allocs/op
PASS
`
	dc, err := parseDenyCache([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cas, variant, unit string
		want               float64
	}{
		{"put/size=1000", "before", "ns/op", 13275},
		{"put/size=1000", "after", "p99-ns", 170},
		{"put/size=10000", "before", "p999-ns", 500000},
		{"put/size=100000", "after", "ns/op", 767.9},
		{"mixed/callers=64", "after-sharded16", "ns/op", 1148},
		{"lookup", "after", "allocs/op", 0},
	} {
		if got, ok := dc[c.cas][c.variant][c.unit]; !ok || got != c.want {
			t.Errorf("%s/%s %s = %v (%v), want %v", c.cas, c.variant, c.unit, got, ok, c.want)
		}
	}
	var b strings.Builder
	writeDenyCache(func(f string, a ...any) { b.WriteString(strings.TrimSpace(strings.ReplaceAll(f, "%", "%%")) + "\n") }, dc)
	if !strings.Contains(b.String(), "### Deny cache under attack") {
		t.Errorf("section:\n%s", b.String())
	}
}
