package dirwatch

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// TestRun: one reload once the watch is set up, and one for an event in a
// watched directory, long before the interval; a directory that does not
// exist yet does not keep the others from being watched.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	later := filepath.Join(t.TempDir(), "later")
	var n atomic.Int64
	calls := make(chan struct{}, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		Run(ctx, []string{dir, later}, time.Hour, slog.New(slog.NewTextHandler(io.Discard, nil)), func() {
			n.Add(1)
			calls <- struct{}{}
		})
		close(done)
	}()
	wait := func(what string) {
		t.Helper()
		select {
		case <-calls:
		case <-time.After(30 * time.Second):
			t.Fatalf("no reload %s (%d so far)", what, n.Load())
		}
	}
	wait("once the watch is set up")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	wait("after a file was written (the interval is an hour)")
	cancel()
	<-done
}
