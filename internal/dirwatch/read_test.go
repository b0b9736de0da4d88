package dirwatch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// swapper updates a volume the way the kubelet's atomic writer does: a new
// snapshot directory, ..data renamed to it, the old snapshot removed at once.
type swapper struct {
	dir string
	n   int
}

func (s *swapper) write(t *testing.T, name string, data []byte) {
	s.n++
	ts := fmt.Sprintf("..snap_%d", s.n)
	if err := os.Mkdir(filepath.Join(s.dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.dir, ts, name), data, 0o644); err != nil {
		t.Fatal(err)
	}
	old, _ := os.Readlink(filepath.Join(s.dir, "..data"))
	tmp := filepath.Join(s.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(s.dir, name)); errors.Is(err, fs.ErrNotExist) {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(s.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if old != "" {
		_ = os.RemoveAll(filepath.Join(s.dir, old))
	}
}

// TestReadFileDuringSwaps: reads while the volume is swapped back to back
// never find the file missing. A plain read (os.Open) does, now and then:
// it followed ..data to the snapshot the writer removed next (the naive
// case, checked to fail, so that this test can).
func TestReadFileDuringSwaps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		read  func(string) ([]byte, error)
		naive bool
	}{
		{"ReadFile", func(p string) ([]byte, error) { return ReadFile(p, 1<<10) }, false},
		{"naive: plain read", func(p string) ([]byte, error) { return readBounded(p, 1<<10) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &swapper{dir: t.TempDir()}
			s.write(t, "config.json", []byte("{}"))
			path := filepath.Join(s.dir, "config.json")
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Go(func() {
				for !stop.Load() {
					s.write(t, "config.json", []byte("{}"))
				}
			})
			// 3 s; the naive read until it failed once (up to 20 s: a few
			// reads in 100,000 fail, fewer under the race detector).
			limit := 3 * time.Second
			if tc.naive {
				limit = 20 * time.Second
			}
			var reads, fails int
			for start := time.Now(); time.Since(start) < limit && (!tc.naive || fails == 0); {
				reads++
				if _, err := tc.read(path); err != nil {
					fails++
				}
			}
			stop.Store(true)
			wg.Wait()
			t.Logf("%d of %d reads failed during %d swaps", fails, reads, s.n)
			switch {
			case tc.naive && fails == 0:
				t.Errorf("a plain read never failed in %d reads during %d swaps: this test cannot fail", reads, s.n)
			case !tc.naive && fails > 0:
				t.Errorf("%d of %d reads failed during swaps", fails, reads)
			}
		})
	}
	// A file missing from the snapshot in force is missing.
	s := &swapper{dir: t.TempDir()}
	s.write(t, "other", nil)
	if _, err := ReadFile(filepath.Join(s.dir, "config.json"), 1<<10); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v", err)
	}
}
