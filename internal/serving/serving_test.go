package serving

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// fakeMain is a main server whose drain takes drainFor.
type fakeMain struct {
	stop            chan struct{}
	drainFor        time.Duration
	drained, closed atomic.Bool
}

func (f *fakeMain) main() Main {
	f.stop = make(chan struct{})
	return Main{
		Name:  "main",
		Serve: func() error { <-f.stop; return nil },
		Drain: func(ctx context.Context) error {
			select {
			case <-time.After(f.drainFor):
				f.drained.Store(true)
				close(f.stop)
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
		Close: func() { f.closed.Store(true); close(f.stop) },
	}
}

// TestRunShutsDownInOrder: not ready first, then the delay, the drain and
// the admin server; a drain over its bound is closed; a failed server
// skips the delay and is the error returned.
func TestRunShutsDownInOrder(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	const delay = 200 * time.Millisecond

	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		f := &fakeMain{}
		admin := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second}
		var stoppedAt time.Time
		done := make(chan error, 1)
		go func() {
			done <- Run(ctx, f.main(), []Aux{{Name: "admin", Server: admin, Listener: listen(t)}},
				Options{Delay: delay, Timeout: time.Second, Stopping: func() { stoppedAt = time.Now() }, Log: log})
		}()
		time.Sleep(50 * time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if stoppedAt.IsZero() || time.Since(stoppedAt) < delay {
			t.Errorf("Stopping called at %v; Run returned %v later, want at least the delay %v", stoppedAt, time.Since(stoppedAt), delay)
		}
		if !f.drained.Load() || f.closed.Load() {
			t.Errorf("drained %v closed %v, want a drain and no close", f.drained.Load(), f.closed.Load())
		}
		if err := admin.Serve(listen(t)); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("the admin server still serves: %v", err)
		}
	})

	t.Run("drain over its bound", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		f := &fakeMain{drainFor: time.Hour}
		if err := Run(ctx, f.main(), nil, Options{Timeout: 50 * time.Millisecond, Log: log}); err != nil {
			t.Fatal(err)
		}
		if !f.closed.Load() {
			t.Error("a drain that ran out of time was not closed")
		}
	})

	t.Run("a server fails", func(t *testing.T) {
		f := &fakeMain{}
		broken := listen(t)
		_ = broken.Close()
		start := time.Now()
		err := Run(context.Background(), f.main(), []Aux{{Name: "admin", Server: &http.Server{ReadHeaderTimeout: time.Second}, Listener: broken}},
			Options{Delay: time.Hour, Timeout: time.Second, Log: log})
		if err == nil || !strings.HasPrefix(err.Error(), "admin: ") {
			t.Errorf("Run = %v, want the admin server's error", err)
		}
		if d := time.Since(start); d > time.Minute {
			t.Errorf("Run took %v: the delay was not skipped", d)
		}
	})
}
