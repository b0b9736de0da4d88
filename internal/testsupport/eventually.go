package testsupport

import (
	"testing"
	"time"
)

// Eventually polls cond every interval until it returns nil, or fails the
// test with what and cond's last error once timeout has passed.
func Eventually(tb testing.TB, timeout, interval time.Duration, what string, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(interval) // polling interval, not synchronisation
	}
}
