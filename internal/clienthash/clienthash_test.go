package clienthash

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
)

func TestSum(t *testing.T) {
	h, err := New(NamespaceKey([]byte("install-key-of-at-least-16"), "shop"))
	if err != nil {
		t.Fatal(err)
	}
	unkeyed := sha256.Sum256([]byte("ip:192.0.2.1"))
	for _, tc := range []struct{ in, prefix string }{
		{"ip:192.0.2.1", "ip:"},
		{"ip:2001:db8::/64", "ip:"},
		{"h:AAAAAAAAAAAAAAAAAAAAAA", "h:"},
		{"jwt:x", "jwt:"},
		{"nocolon", ""},
	} {
		got := h.Sum(tc.in)
		rest, ok := strings.CutPrefix(got, tc.prefix)
		if !ok || len(rest) != 22 || strings.Contains(got, "192.0.2.1") || strings.Contains(got, "db8") {
			t.Errorf("Sum(%q) = %q: want %q and 22 characters of hash", tc.in, got, tc.prefix)
		}
		if got != h.Sum(tc.in) {
			t.Errorf("Sum(%q) is not stable", tc.in)
		}
	}
	if got := h.Sum("ip:192.0.2.1"); got == "ip:"+base64.RawURLEncoding.EncodeToString(unkeyed[:16]) {
		t.Error("the keyed hash is the unkeyed SHA-256")
	}
	if got := h.Sum("global"); got != "global" {
		t.Errorf("Sum(global) = %q", got)
	}
}

// TestKeysPerNamespace: another namespace, or another install, hashes the
// same client differently; one namespace's key does not give another's.
func TestKeysPerNamespace(t *testing.T) {
	install := []byte(NewInstallKey())
	shop, _ := New(NamespaceKey(install, "shop"))
	bank, _ := New(NamespaceKey(install, "bank"))
	other, _ := New(NamespaceKey([]byte(NewInstallKey()), "shop"))
	again, _ := New(NamespaceKey(install, "shop"))
	const c = "ip:192.0.2.1"
	if shop.Sum(c) == bank.Sum(c) || shop.Sum(c) == other.Sum(c) || shop.ID() == bank.ID() {
		t.Error("two namespaces or two installs share hashes")
	}
	if shop.Sum(c) != again.Sum(c) || shop.ID() != again.ID() {
		t.Error("the same namespace key hashes differently")
	}
	if r := Random(); r.Configured || r.Sum(c) == Random().Sum(c) {
		t.Error("random hashers share a key")
	}
	if _, err := New("short"); err == nil {
		t.Error("a 5-byte key was taken")
	}
}

// BenchmarkSum is what naming a client costs each 429 (/debug/top counts
// it) and each /debug/why answer.
func BenchmarkSum(b *testing.B) {
	h, _ := New(NamespaceKey([]byte(NewInstallKey()), "shop"))
	for b.Loop() {
		_ = h.Sum("h:k2UDsTv2Na7fFFI7pLIVmA")
	}
}
