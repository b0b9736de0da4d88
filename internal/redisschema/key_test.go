package redisschema

import (
	"strings"
	"testing"
)

func TestKey(t *testing.T) {
	long := strings.Repeat("x", 65)
	for _, tc := range []struct{ prefix, rule, client, want string }{
		{"slidegate:", "ns/policy", "10.0.0.1", "slidegate:{ns/policy:10.0.0.1}"},
		{"slidegate:", "ns/policy", "2001:db8::1", "slidegate:{ns/policy:2001:db8::1}"},
		{"slidegate:", "ns/policy", "", "slidegate:{ns/policy:}"},
		// Braces from input can never form or end the hash tag.
		{"slidegate:", "ns/policy", "a}b{c", "slidegate:{ns/policy:a%7Db%7Bc}"},
		{"p{x}:", "r", "c", "p%7Bx%7D:{r:c}"},
		// ':' in a rule id is escaped so rule "a:b"/client "c" differs
		// from rule "a"/client "b:c".
		{"p:", "a:b", "c", "p:{a%3Ab:c}"},
		{"p:", "a", "b:c", "p:{a:b:c}"},
		{"p:", "ns/p", "100%", "p:{ns/p:100%25}"},
		{"p:", "ns/p", "~x", "p:{ns/p:%7Ex}"},
		{"p:", "ns/p", "caf\xc3\xa9 bar", "p:{ns/p:caf%C3%A9%20bar}"},
		{"p:", "ns/p", long, "p:{ns/p:" + hashed(long) + "}"},
	} {
		if got := Key(tc.prefix, tc.rule, tc.client); got != tc.want {
			t.Errorf("Key(%q, %q, %q) = %q, want %q", tc.prefix, tc.rule, tc.client, got, tc.want)
		}
	}
	if got := Key("p:", "r", strings.Repeat("x", 64)); !strings.HasSuffix(got, strings.Repeat("x", 64)+"}") {
		t.Errorf("a 64-byte client was hashed: %q", got)
	}
	if a, b := Key("p:", "r", long), Key("p:", "r", long+"y"); a == b {
		t.Error("two long clients share a key")
	}
}

// FuzzKey: for any input the key is deterministic, bounded, has exactly
// one hash tag made of the escaped rule and client, and distinct
// (rule, client) pairs get distinct keys and different tags.
// The seed corpus is in testdata/fuzz/FuzzKey.
func FuzzKey(f *testing.F) {
	f.Add("slidegate:", "ns/policy", "10.0.0.1", "ns/policy", "10.0.0.2")
	f.Add("p{", "a:b", "c", "a", "b:c")
	f.Add("", "}", "{", "{", "}")
	f.Fuzz(func(t *testing.T, prefix, rule, client, rule2, client2 string) {
		k := Key(prefix, rule, client)
		if k != Key(prefix, rule, client) {
			t.Fatal("not deterministic")
		}
		p := escapePrefix(prefix)
		if !strings.HasPrefix(k, p+"{") || !strings.HasSuffix(k, "}") {
			t.Fatalf("%q: not <prefix>{...}", k)
		}
		if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
			t.Fatalf("%q: braces from input", k)
		}
		if len(k) > len(p)+maxRulePart+maxClientPart+3 {
			t.Fatalf("%q: %d bytes, unbounded", k, len(k))
		}
		tag := HashTag(k)
		if tag != k[len(p)+1:len(k)-1] {
			t.Fatalf("%q: hash tag %q is not the rule and client", k, tag)
		}
		if Slot(k) != Slot(tag) || Slot(k) != Slot(CounterKey(prefix, rule, client)) {
			t.Fatalf("%q: the counter key is in another slot", k)
		}
		k2 := Key(prefix, rule2, client2)
		if same := rule == rule2 && client == client2; same != (k == k2) {
			t.Fatalf("(%q,%q)→%q and (%q,%q)→%q", rule, client, k, rule2, client2, k2)
		}
	})
}

func BenchmarkKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = Key("slidegate:", "default/api-limit", "10.12.13.14")
	}
}
