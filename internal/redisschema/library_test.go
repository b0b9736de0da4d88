package redisschema

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/slidegate/slidegate/internal/testsupport"
)

var update = flag.Bool("update", false, "rewrite testdata/library.revision")

// TestLibraryRevision: the library's source changes only with its
// revision. testdata/library.revision holds the revision and the source's
// SHA-256; a change to any function (or to the way they are registered)
// without a new LibraryRevision fails here, since a manager must never
// replace a library of the same revision with other code, nor a newer one
// with an older (EnsureLibrary). Rewrite it with -update after raising
// LibraryRevision.
func TestLibraryRevision(t *testing.T) {
	sum := sha256.Sum256([]byte(librarySource))
	got := fmt.Sprintf("%d %s\n", LibraryRevision, hex.EncodeToString(sum[:]))
	file := filepath.Join("testdata", "library.revision")
	if *update {
		if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	wantRev, wantSum, _ := strings.Cut(strings.TrimSpace(string(want)), " ")
	switch {
	case got == string(want):
	case wantRev == strconv.Itoa(LibraryRevision):
		t.Errorf("the library's source changed (sha256 %s, recorded %s) but LibraryRevision is still %d: raise it, then run with -update", hex.EncodeToString(sum[:]), wantSum, LibraryRevision)
	default:
		t.Errorf("LibraryRevision is %d, %s records %s: run with -update", LibraryRevision, file, wantRev)
	}
	if !strings.HasPrefix(librarySource, "#!lua name="+LibraryName+"\n") {
		t.Errorf("the library does not start with its shebang: %.60q", librarySource)
	}
}

// TestEnsureLibrary: the library is loaded where it is missing, left where
// it is current or of a higher revision (a newer manager's), and replaced
// where it is older.
func TestEnsureLibrary(t *testing.T) {
	t.Parallel()
	r := testsupport.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	for i, want := range []LibraryState{LibraryLoaded, LibraryCurrent} {
		if got, err := EnsureLibrary(ctx, rdb); err != nil || got != want {
			t.Fatalf("call %d: %q, %v; want %q", i+1, got, err, want)
		}
	}
	newer := strings.Replace(librarySource, fmt.Sprintf("revision %d\n", LibraryRevision), fmt.Sprintf("revision %d\n", LibraryRevision+1), 1) +
		"\nredis.register_function('slidegate_next_v2', function(keys, args) return 2 end)\n"
	if err := rdb.FunctionLoadReplace(ctx, newer).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := EnsureLibrary(ctx, rdb); err != nil || got != LibraryNewer {
		t.Fatalf("over a newer revision: %q, %v", got, err)
	}
	if v, err := rdb.FCall(ctx, "slidegate_next_v2", nil).Int(); err != nil || v != 2 {
		t.Fatalf("the newer library was replaced: %d, %v", v, err)
	}
	older := strings.Replace(librarySource, fmt.Sprintf("revision %d\n", LibraryRevision), "revision 0\n", 1)
	older = strings.Replace(older, "slidegate_peek_v1", "slidegate_peek_v0", 1)
	if err := rdb.FunctionLoadReplace(ctx, older).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := EnsureLibrary(ctx, rdb); err != nil || got != LibraryLoaded {
		t.Fatalf("over an older revision: %q, %v", got, err)
	}
	if err := rdb.FCallRO(ctx, "slidegate_peek_v1", []string{"k"}, 1, 1000, 0).Err(); err != nil {
		t.Fatalf("after replacing the older library: %v", err)
	}
}
