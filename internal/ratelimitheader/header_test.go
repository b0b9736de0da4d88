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
