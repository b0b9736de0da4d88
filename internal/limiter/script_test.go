package limiter

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// Table tests of the one place that knows the scripts' command and reply
// layout (script.go). New layout cases go here; what the scripts compute
// is tested against a real Redis in the other files.

func TestDecodeDecide(t *testing.T) {
	ints := func(n ...int64) []any {
		v := make([]any, len(n))
		for i, x := range n {
			v[i] = x
		}
		return v
	}
	for _, tc := range []struct {
		name  string
		v     any
		nkeys int
		want  decideReply
		err   string
	}{
		{
			name: "one key, committed", nkeys: 1,
			v:    ints(123, 1, 1, 9, 0, 1000000, 0),
			want: decideReply{now: 123, committed: true, keys: []keyReply{{allowed: true, remaining: 9, resetAfter: time.Second}}},
		},
		{
			name: "two keys, the second denies, counter field", nkeys: 2,
			v: ints(5, 0, 1, 3, 0, 2000, 77, 0, 0, 1500, 60000000, 0),
			want: decideReply{now: 5, keys: []keyReply{
				{allowed: true, remaining: 3, resetAfter: 2 * time.Millisecond, field: 77},
				{retryAfter: 1500 * time.Microsecond, resetAfter: time.Minute},
			}},
		},
		{name: "not an array", nkeys: 1, v: int64(1), err: "unexpected reply int64"},
		{name: "not an integer", nkeys: 1, v: []any{int64(1), "x"}, err: "unexpected reply element string"},
		{name: "short", nkeys: 1, v: ints(1, 1, 1, 0, 0, 0), err: "malformed reply of 6 values"},
		{name: "reply for fewer keys", nkeys: 2, v: ints(1, 1, 1, 0, 0, 0, 0), err: "malformed reply of 7 values"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeDecide(tc.v, tc.nkeys, nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("reply:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestDecodeDecideUsesBuffer: a one-key reply fits the caller's buffer, so
// the hot path does not allocate it.
func TestDecodeDecideUsesBuffer(t *testing.T) {
	var buf [1]keyReply
	rep, err := decodeDecide([]any{int64(1), int64(1), int64(1), int64(0), int64(0), int64(0), int64(0)}, 1, buf[:0])
	if err != nil {
		t.Fatal(err)
	}
	if &rep.keys[0] != &buf[0] {
		t.Error("the reply's keys are not in the buffer")
	}
}

func TestDecideArgs(t *testing.T) {
	reqs := []Request{
		{Rule: Rule{Limit: 10, Window: time.Second}},
		{Rule: Rule{Limit: 5, Window: 1500 * time.Nanosecond, Algorithm: SlidingWindowCounter}, DryRun: true, Hits: 3},
	}
	for _, tc := range []struct {
		name   string
		idx    []int
		keys   []string
		commit bool
		want   []any
	}{
		{
			name: "one key", idx: []int{0}, keys: []string{"k0"}, commit: true,
			want: []any{"evalsha", decideLua.sha, 1, "k0", "m", "1000", "1", int64(10), int64(1000000), "0", "1"},
		},
		{
			// The window rounds up to whole µs; flags are counter|dry-run.
			name: "two keys, decide only", idx: []int{0, 1}, keys: []string{"k0", "k1"},
			want: []any{"evalsha", decideLua.sha, 2, "k0", "k1", "m", "1000", "0",
				int64(10), int64(1000000), "0", "1", int64(5), int64(2), "3", int64(3)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decideArgs(nil, api{}, reqs, tc.idx, tc.keys, "m", "1000", tc.commit)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("args:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	var o op
	if args := decideArgs(o.argsBuf[:0], api{}, reqs, []int{0}, []string{"k0"}, "m", "1000", true); &args[0] != &o.argsBuf[0] {
		t.Error("a one-key command does not fit op.argsBuf")
	}
}

func TestUndoArgs(t *testing.T) {
	got := undoArgs(api{}, "m", []undoKey{
		{key: "log", hits: 1},
		{key: "ctr", counter: true, field: 42, hits: 7},
	})
	want := []any{"evalsha", undoLua.sha, 2, "log", "ctr", "m", "", "1", "42", "7"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("args:\n got %+v\nwant %+v", got, want)
	}
}

func TestAsEval(t *testing.T) {
	args := []any{"evalsha", undoLua.sha, 1, "k", "m", "", "1"}
	got := asEval(args, &undoLua)
	want := []any{"eval", redisschema.Undo.Body, 1, "k", "m", "", "1"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("args:\n got %+v\nwant %+v", got, want)
	}
	if args[0] != "evalsha" || args[1] != undoLua.sha {
		t.Error("asEval modified the EVALSHA command")
	}
}
