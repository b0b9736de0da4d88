package limiter

import (
	"crypto/sha1" //nolint:gosec // SHA-1 is what Redis names scripts by, not a security measure.
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/slidegate/slidegate/internal/redisschema"
)

// scoreEpoch is the origin of the scores (redisschema.ScoreEpoch).
const scoreEpoch = redisschema.ScoreEpoch

// serverTime converts a score (µs since scoreEpoch) to wall-clock time.
func serverTime(us int64) time.Time {
	return time.Unix(scoreEpoch, 0).Add(time.Duration(us) * time.Microsecond)
}

// script is one of the limiter's Lua scripts (a redisschema.Function),
// called by EVALSHA of its source or, from the slidegate library, by FCALL
// of its function.
type script struct {
	src string
	sha string
	fn  string // the library's function (versioned name)
	// The two arguments that name it, boxed once (see argEvalSha).
	shaArg, fnArg any
}

func newScript(f redisschema.Function) script {
	h := sha1.Sum([]byte(f.Body)) //nolint:gosec // see import
	sha := hex.EncodeToString(h[:])
	return script{src: f.Body, sha: sha, fn: f.Name, shaArg: sha, fnArg: f.Name}
}

var (
	decideLua = newScript(redisschema.Decide)
	undoLua   = newScript(redisschema.Undo)
	cancelLua = newScript(redisschema.Cancel)
)

// maxScriptKeys bounds the keys of one script call; the scripts refuse
// more (1024 in their source). Larger groups are split (grouping.split).
const maxScriptKeys = 1024

// api is how the limiter calls its scripts: EVALSHA of the script's
// source (Options.Functions false), or FCALL of the slidegate library's
// function. The command's layout after its first two arguments is the
// same: numkeys, KEYS, ARGV.
type api struct{ functions bool }

// head is the command name and the script's name in it.
func (a api) head(s *script) (cmd, name any) {
	if a.functions {
		return argFCall, s.fnArg
	}
	return argEvalSha, s.shaArg
}

// apiOf is the api that built the script command args.
func apiOf(args []any) api { return api{functions: args[0] == argFCall} }

// The layout of the two scripts' commands and of the decide reply, as the
// comments on redisschema's decideScript and undoScript document it.
// Nothing outside the functions below indexes into a command or a reply.
//
//	EVALSHA sha numkeys KEYS[1..n] ARGV[1..]
//	FCALL function numkeys KEYS[1..n] ARGV[1..]
const (
	cmdHead         = 3 // "evalsha", sha, numkeys (or "fcall", function, numkeys)
	decideHead      = 3 // ARGV[1..3]: member, margin, commit
	decidePerKey    = 4 // limit, window µs, flags, hits
	replyHead       = 2 // now, committed
	replyPerKey     = 5 // allowed, remaining, retry-after, reset-after, field
	oneKeyDecideLen = cmdHead + 1 + decideHead + decidePerKey
)

// Flags of one key in the decide script's arguments.
const (
	flagCounter  = 1 // SlidingWindowCounter instead of SlidingLog
	flagDryRun   = 2 // a denial here does not stop the group's commit
	flagWeighted = 4 // hits are a cost (Rule.Weighted): 0 is a check
	flagCharge   = 8 // a weighted charge: admitted whatever the limit
	// flagCalendar: a calendar rule's counter for the period its key names
	// (decideScript only; decideSize keeps such decisions out of batches).
	flagCalendar = 16
)

// Arguments boxed once: converting a string to any allocates, and these
// recur in every command.
var (
	argEvalSha = any("evalsha")
	argFCall   = any("fcall")
	// argCommit is ARGV[3], indexed by whether the script may admit.
	argCommit = [2]any{"0", "1"}
	// argKeyFlags is a key's flags argument, indexed by its flags.
	argKeyFlags = [flagCalendar << 1]any{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
		"16", "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31"}
	argOneHit = any("1")
)

// decideArgs lays out the decide script's command for the requests
// reqs[idx[k]] under keys[k], appending to buf (grown when too short).
// commit false only decides: nothing is admitted.
func decideArgs(buf []any, a api, reqs []Request, idx []int, keys []string, member, marginMs string, commit bool) []any {
	n := len(idx)
	args := buf[:0]
	if size := cmdHead + n + decideHead + decidePerKey*n; size > cap(buf) {
		args = make([]any, 0, size)
	}
	cmd, name := a.head(&decideLua)
	args = append(args, cmd, name, n)
	for _, k := range keys {
		args = append(args, k)
	}
	c := argCommit[0]
	if commit {
		c = argCommit[1]
	}
	args = append(args, member, marginMs, c)
	for _, i := range idx {
		r := &reqs[i]
		f := 0
		switch {
		case r.Rule.Calendar != nil:
			f |= flagCalendar
		case r.Rule.Algorithm == SlidingWindowCounter:
			f |= flagCounter
		}
		if r.DryRun {
			f |= flagDryRun
		}
		if r.Rule.Weighted {
			f |= flagWeighted
			if r.Op == OpCharge {
				f |= flagCharge
			}
		}
		args = append(args, r.Rule.Limit, windowMicros(r.Rule.Window), argKeyFlags[f])
		if h := r.hits(); h == 1 {
			args = append(args, argOneHit)
		} else {
			args = append(args, h)
		}
	}
	return args
}

// windowMicros is a window as the scripts take it: in whole µs, rounded
// up, so a window is never shorter than the rule says.
func windowMicros(w time.Duration) int64 {
	return int64((w + time.Microsecond - 1) / time.Microsecond)
}

// undoKey is one key whose admit the undo script takes back.
type undoKey struct {
	key      string
	counter  bool  // a SlidingWindowCounter key
	weighted bool  // a Weighted rule's key (a log's field is "w")
	field    int64 // the counter field it incremented (counter only)
	hits     int64
}

// undoArgs lays out the undo script's command taking back the admits of keys,
// all made under member.
func undoArgs(a api, member string, keys []undoKey) []any {
	args := make([]any, 0, cmdHead+len(keys)+1+2*len(keys))
	cmd, name := a.head(&undoLua)
	args = append(args, cmd, name, len(keys))
	for _, k := range keys {
		args = append(args, k.key)
	}
	args = append(args, member)
	for _, k := range keys {
		field := ""
		switch {
		case k.counter:
			field = strconv.FormatInt(k.field, 10)
		case k.weighted:
			field = "w"
		}
		args = append(args, field, strconv.FormatInt(k.hits, 10))
	}
	return args
}

// decideKey is one key of a decide command, as decideArgs laid it out.
type decideKey struct {
	key                 string
	window, flags, hits int64
}

// decideKeys reads back the member, whether it commits, and the keys of
// the decide command args.
func decideKeys(args []any) (member string, commit bool, keys []decideKey) {
	n := args[2].(int)
	head := cmdHead + n
	member, commit = args[head].(string), args[head+2] == argCommit[1]
	for k := range n {
		b := head + decideHead + decidePerKey*k
		keys = append(keys, decideKey{key: args[cmdHead+k].(string), window: argInt(args[b+1]), flags: argInt(args[b+2]), hits: argInt(args[b+3])})
	}
	return member, commit, keys
}

// argInt is an integer argument of decideArgs: an int64, or a boxed string.
func argInt(v any) int64 {
	switch v := v.(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

// lateUndoArgs is the undo command for the admits that rep, the reply to
// the decide command args, reports; nil when it admitted nothing.
func lateUndoArgs(args []any, rep decideReply) []any {
	if !rep.committed {
		return nil
	}
	member, _, keys := decideKeys(args)
	var undo []undoKey
	for k, dk := range keys {
		// A charge counts even when its caller gave up; a check wrote nothing.
		if rep.keys[k].allowed && dk.flags&flagCharge == 0 && dk.hits > 0 {
			undo = append(undo, undoKey{key: dk.key, counter: dk.flags&(flagCounter|flagCalendar) != 0, weighted: dk.flags&flagWeighted != 0, field: rep.keys[k].field, hits: dk.hits})
		}
	}
	if len(undo) == 0 {
		return nil
	}
	return undoArgs(apiOf(args), member, undo)
}

// cancelArgs is the cancel command for the SlidingLog keys of the decide
// command args; nil when it does not commit or has none.
func cancelArgs(args []any) []any {
	member, commit, keys := decideKeys(args)
	if !commit {
		return nil
	}
	margin := args[cmdHead+len(keys)+1]
	cmd, name := apiOf(args).head(&cancelLua)
	out := []any{cmd, name, 0}
	var rest []any
	for _, k := range keys {
		switch {
		case k.flags&(flagCounter|flagCalendar) != 0, k.flags&flagCharge != 0, k.flags&flagWeighted != 0 && k.hits == 0:
			// A counter keeps no members; a charge counts once if it ran
			// (a cancel would lose it); a check wrote nothing.
		case k.flags&flagWeighted != 0:
			out = append(out, k.key)
			rest = append(rest, "w"+strconv.FormatInt(k.hits, 10), k.window)
		default:
			out = append(out, k.key)
			rest = append(rest, k.hits, k.window)
		}
	}
	nk := len(out) - cmdHead
	if nk == 0 {
		return nil
	}
	out[2] = nk
	out = append(out, member, margin)
	return append(out, rest...)
}

// asEval turns the EVALSHA command args of s into an EVAL of its source,
// for a server that answered NOSCRIPT (its script cache is gone after a
// restart, a failover or SCRIPT FLUSH); running it caches the script again.
// args is not modified.
func asEval(args []any, s *script) []any {
	ev := make([]any, len(args))
	copy(ev, args)
	ev[0], ev[1] = "eval", s.src
	return ev
}

// decideReply is a decide script's reply, decoded.
type decideReply struct {
	now       int64 // Redis's clock, µs since scoreEpoch
	committed bool  // the allowed keys were admitted into
	keys      []keyReply
}

// keyReply is what a decide reply says about one key.
type keyReply struct {
	allowed    bool
	remaining  int64
	retryAfter time.Duration
	resetAfter time.Duration
	field      int64 // the counter field an admit incremented, for undo
}

// decodeDecide decodes v, the reply of a decide script over nkeys keys,
// appending the keys' parts to buf.
func decodeDecide(v any, nkeys int, buf []keyReply) (decideReply, error) {
	vals, ok := v.([]any)
	if !ok {
		return decideReply{}, fmt.Errorf("limiter: unexpected reply %T", v)
	}
	for _, x := range vals {
		if _, ok := x.(int64); !ok {
			return decideReply{}, fmt.Errorf("limiter: unexpected reply element %T", x)
		}
	}
	if len(vals) != replyHead+replyPerKey*nkeys {
		return decideReply{}, fmt.Errorf("limiter: malformed reply of %d values", len(vals))
	}
	n := func(i int) int64 { return vals[i].(int64) }
	us := func(i int) time.Duration { return time.Duration(n(i)) * time.Microsecond }
	rep := decideReply{now: n(0), committed: n(1) == 1, keys: buf[:0]}
	for k := range nkeys {
		b := replyHead + replyPerKey*k
		rep.keys = append(rep.keys, keyReply{
			allowed:    n(b) == 1,
			remaining:  n(b + 1),
			retryAfter: us(b + 2),
			resetAfter: us(b + 3),
			field:      n(b + 4),
		})
	}
	return rep, nil
}

// ErrNoFunctions marks the error of a call to the slidegate library on a
// Redis that does not have it ("ERR Function not found"): the manager
// loads it (EnsureLibrary), and meanwhile decisions follow each rule's fail
// mode.
var ErrNoFunctions = errors.New("limiter: the slidegate functions are not loaded on this Redis")

// functionsMissing wraps err with ErrNoFunctions when Redis said it does
// not have the function called.
func functionsMissing(err error) error {
	if err != nil && strings.HasPrefix(err.Error(), "ERR Function not found") {
		return fmt.Errorf("%w: %w", ErrNoFunctions, err)
	}
	return err
}

func (l *Limiter) keyOf(r *Request) string {
	if r.Rule.Weighted {
		return redisschema.WeightedKey(l.opts.Prefix, r.Rule.ID, r.Client, r.Rule.Algorithm == SlidingWindowCounter)
	}
	var k string
	if r.Rule.Calendar != nil {
		return redisschema.VariantKey(redisschema.Key(l.opts.Prefix, r.Rule.ID, r.Client), r.Rule.Variant+periodSuffix(r.period))
	}
	if r.Rule.Algorithm == SlidingWindowCounter {
		k = redisschema.CounterKey(l.opts.Prefix, r.Rule.ID, r.Client)
	} else {
		k = redisschema.Key(l.opts.Prefix, r.Rule.ID, r.Client)
	}
	if r.Rule.Variant != "" {
		k = redisschema.VariantKey(k, r.Rule.Variant)
	}
	return k
}
