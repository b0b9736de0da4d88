package limiter

import (
	"crypto/sha1" //nolint:gosec // SHA-1 is what Redis names scripts by, not a security measure.
	"encoding/hex"
	"fmt"
	"strconv"
	"time"
)

// scoreEpoch is the origin of the scores, in Unix seconds (2020-01-01 UTC).
// Microseconds since then stay below 2^53 (exact as Lua doubles and as
// sorted-set scores) for about 285 years, where Unix microseconds would
// leave only a factor of five.
const scoreEpoch = 1577836800

// serverTime converts a score (µs since scoreEpoch) to wall-clock time.
func serverTime(us int64) time.Time {
	return time.Unix(scoreEpoch, 0).Add(time.Duration(us) * time.Microsecond)
}

// decideScript decides every rule of one request whose keys share a slot,
// in one atomic step, with the time of the Redis server (TIME), never the
// caller's: sidecars with skewed clocks still agree.
//
// The arguments are checked first (at most maxScriptKeys keys, hits in
// [1, MaxHits], windows in [1 ms, 1 year]), as in undoScript and
// cancelScript: as the library's functions they run under the namespaces'
// own Redis identities, which can call them directly (FCALL) with any
// arguments, and one call must not loop or allocate without bound (a
// script blocks the whole server while it runs; Lua's memory is not
// bounded by maxmemory).
//
//	KEYS[i]           the key of rule i
//	ARGV[1]           member: unique per decision (process id + sequence),
//	                  so two admits in one microsecond never merge
//	ARGV[2]           expiry margin in ms
//	ARGV[3]           "1" to admit, "0" to only decide (the request is
//	                  already known to fail elsewhere)
//	ARGV[4i..4i+3]    limit, window in µs, flags, hits of rule i
//
// hits is what the request costs (1 for an HTTP request; Envoy's
// hits_addend for the RLS server): the key admits it only if count+hits
// fits the limit, and a SlidingLog admit adds hits members (member, then
// member.2 .. member.hits), so every window counts each hit.
// Phase one trims and counts every key; phase two admits into every allowed
// key only if no non-dry-run key denied (all or nothing), and sets PEXPIRE
// (ms, window+margin) on each key on every call.
//
// Reply: now (µs since scoreEpoch), committed (0/1), then per key: allowed,
// remaining, retry-after µs, reset-after µs, counter field (for undo).
//
// SlidingLog keys are sorted sets scored by admit time. Retry-after is
// exact: the admit at rank count-limit is the one whose leaving the window
// lets the next request in.
//
// SlidingWindowCounter keys are hashes with one field per fixed window
// (index = floor(now/window)); the estimate is prev×(1-elapsed/window)+cur.
// undoScript's field "u" may sit beside them.
//
// A committing call first looks for its own member in its SlidingLog keys:
// found, the decision was already admitted (go-redis re-ran the script
// after losing its reply, or a cancel ran first) and the script admits
// nothing, replying committed as the first run did. A counter key keeps no
// members, so a rerun of a decision with only counter keys counts it twice:
// a marker per key would have cost every counter key a third more memory
// (104 → 136 B per client), for a rare lost reply on Redis Cluster, and
// would only remember the key's last admit.
const decideScript = `
local n = #KEYS
if n < 1 or n > 1024 or #ARGV ~= 3 + 4 * n or not tonumber(ARGV[2]) then
  return redis.error_reply('ERR slidegate: malformed decide call')
end
for i = 1, n do
  local b = 4 * i
  local w, f, h = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  if not tonumber(ARGV[b]) or not w or w < 1000 or w > 31536000000000 or not f or f < 0 or f > 3 or not h or h < 1 or h > 1000 then
    return redis.error_reply('ERR slidegate: decide argument out of range')
  end
end
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1577836800) * 1000000 + tonumber(t[2])
local member = ARGV[1]
local margin = tonumber(ARGV[2])

-- mine reports whether this decision already admitted into key (a
-- SlidingLog key; a counter key keeps no members).
local function mine(key, ctr)
  if ctr then return false end
  return redis.call('ZSCORE', key, member) ~= false
end

-- check trims and counts one key: allowed, estimate/count, counter field,
-- current and previous fixed-window counts.
local function check(key, l, w, ctr, h)
  if ctr then
    local x = math.floor(now / w)
    local v = redis.call('HMGET', key, x, x - 1)
    local c, p = tonumber(v[1]) or 0, tonumber(v[2]) or 0
    local e = p * (w - (now - x * w)) / w + c
    return e + h <= l, e, x, c, p
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - w)
  local c = redis.call('ZCARD', key)
  return c + h <= l, c, 0, c, 0
end

-- finish admits into one key when commit, sets its expiry and appends
-- its five reply values to out.
local function finish(out, key, l, w, ctr, h, ok, commit, e, x, c, p)
  local rem, retry, reset, field = 0, 0, 0, 0
  local exists = commit
  local ttl = w
  if ctr then
    local elapsed = now - x * w
    -- This window's count weighs on the next one until that one ends.
    ttl = 2 * w - elapsed
    if commit then
      if redis.call('HINCRBY', key, x, h) == h and redis.call('HLEN', key) > 2 then
        for _, k in ipairs(redis.call('HKEYS', key)) do
          local kn = tonumber(k)
          if kn and kn ~= x and kn ~= x - 1 then redis.call('HDEL', key, k) end
        end
      end
      c, e, field = c + h, e + h, x
    end
    rem = math.floor(l - e)
    if commit or c > 0 then
      reset = w
    elseif p > 0 then
      reset = w - elapsed
    end
    exists = exists or c > 0 or p > 0
    if not ok then
      if l < h then
        retry = w
      elseif p > 0 and l - h - c >= 0 then
        retry = math.ceil(w * (1 - (l - h - c) / p) - elapsed)
      else
        local need = 0
        if c > l - h then need = w * (1 - (l - h) / c) end
        retry = math.ceil(w - elapsed + need)
      end
      if retry < 1 then retry = 1 end
    end
  else
    if commit then
      if h == 1 then
        redis.call('ZADD', key, now, member)
      else
        local zargs = {now, member}
        for j = 2, h do
          zargs[2 * j - 1], zargs[2 * j] = now, member .. '.' .. j
        end
        redis.call('ZADD', key, unpack(zargs))
      end
      c = c + h
      reset = w
    elseif c > 0 then
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      reset = tonumber(last[2]) + w - now
    end
    exists = exists or c > 0
    if not ok then
      local r = {}
      -- The admit whose leaving makes room for h more: rank c+h-l-1.
      if l >= h then r = redis.call('ZRANGE', key, c + h - l - 1, c + h - l - 1, 'WITHSCORES') end
      if r[2] then retry = tonumber(r[2]) + w - now else retry = w end
    end
    rem = l - c
  end
  if exists then redis.call('PEXPIRE', key, math.ceil(ttl / 1000) + margin) end
  if rem < 0 then rem = 0 end
  local o = #out
  out[o + 1] = ok and 1 or 0
  out[o + 2] = rem
  out[o + 3] = retry
  out[o + 4] = reset
  out[o + 5] = field
end

-- replay answers a decision already admitted: committed, each key as it
-- now stands (counting the admit), allowed where it was admitted.
local function replay()
  local out = {now, 1}
  for i = 1, #KEYS do
    local b = 4 * i
    local l, w, f, h = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    local ctr = f % 2 == 1
    local _, e, x, c, p = check(KEYS[i], l, w, ctr, h)
    -- The first run committed: every rule but the dry-run ones admitted.
    local ok = mine(KEYS[i], ctr) or f < 2
    finish(out, KEYS[i], l, w, ctr, h, ok, false, e, x, c, p)
    if ok and ctr then out[#out] = x end
  end
  return out
end

local pass = ARGV[3] == '1'
if pass then
  for i = 1, n do
    if mine(KEYS[i], tonumber(ARGV[4 * i + 2]) % 2 == 1) then return replay() end
  end
end
if n == 1 then
  -- The common case, without the per-key tables.
  local key, l, w, f, h = KEYS[1], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local ctr = f % 2 == 1
  local ok, e, x, c, p = check(key, l, w, ctr, h)
  pass = pass and (ok or f >= 2)
  local out = {now, pass and 1 or 0}
  finish(out, key, l, w, ctr, h, ok, pass and ok, e, x, c, p)
  return out
end
local lim, win, ctr, hs, oks, es, xs, cs, ps = {}, {}, {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  local b = 4 * i
  local l, w, f, h = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  lim[i], win[i], ctr[i], hs[i] = l, w, f % 2 == 1, h
  oks[i], es[i], xs[i], cs[i], ps[i] = check(KEYS[i], l, w, ctr[i], h)
  if not oks[i] and f < 2 then pass = false end
end
local out = {now, pass and 1 or 0}
for i = 1, n do
  finish(out, KEYS[i], lim[i], win[i], ctr[i], hs[i], oks[i], pass and oks[i], es[i], xs[i], cs[i], ps[i])
end
return out
`

// undoScript takes back the admits of a request that another slot's rules
// denied (the compensating call of a cross-slot request), or of a decision
// whose caller gave up before the reply came (undoLate). Run twice (a
// Cluster client's retry), it takes back once: ZREM is idempotent, and a
// counter key's field "u" holds the member last undone. A counter key that
// is gone is left alone: it expired, so its admits no longer weigh on any
// window, and writing "u" would create it without an expiry.
//
//	KEYS[i]     the key of an admitted rule
//	ARGV[1]     the member that was added
//	ARGV[2i]    "" for a SlidingLog key, else the counter field incremented
//	ARGV[2i+1]  the hits that were added
const undoScript = `
local n = #KEYS
if n < 1 or n > 1024 or #ARGV ~= 1 + 2 * n then
  return redis.error_reply('ERR slidegate: malformed undo call')
end
for i = 1, n do
  local h = tonumber(ARGV[2 * i + 1])
  if not h or h < 1 or h > 1000 then return redis.error_reply('ERR slidegate: undo argument out of range') end
end
for i = 1, n do
  local f, h = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  if f == '' then
    local ms = {ARGV[1]}
    for j = 2, h do ms[j] = ARGV[1] .. '.' .. j end
    redis.call('ZREM', KEYS[i], unpack(ms))
  elseif redis.call('HGET', KEYS[i], 'u') ~= ARGV[1] and redis.call('PTTL', KEYS[i]) ~= -2 then
    local v = tonumber(redis.call('HGET', KEYS[i], f))
    if v and v > 0 then redis.call('HINCRBY', KEYS[i], f, -math.min(v, h)) end
    redis.call('HSET', KEYS[i], 'u', ARGV[1])
  end
end
return 1
`

// cancelScript takes back the SlidingLog admits of a decision whose script
// may have run but whose reply was lost (a timeout or a dropped connection
// after the command was written). Without a reply the script may also run
// after the cancel (it may still be in a socket buffer): an absent member
// is then added with score 0, which decideScript takes for the decision's
// own admit (and admits nothing) and every other decision trims as stale.
//
//	KEYS[i]     a SlidingLog key of the decision
//	ARGV[1]     its member, ARGV[2] the expiry margin in ms
//	ARGV[2i+1]  the key's hits, ARGV[2i+2] its window in µs
const cancelScript = `
local n = #KEYS
if n < 1 or n > 1024 or #ARGV ~= 2 + 2 * n or not tonumber(ARGV[2]) then
  return redis.error_reply('ERR slidegate: malformed cancel call')
end
for i = 1, n do
  local h, w = tonumber(ARGV[2 * i + 1]), tonumber(ARGV[2 * i + 2])
  if not h or h < 1 or h > 1000 or not w or w < 1000 or w > 31536000000000 then
    return redis.error_reply('ERR slidegate: cancel argument out of range')
  end
end
for i = 1, n do
  local key, h = KEYS[i], tonumber(ARGV[2 * i + 1])
  local ms = {ARGV[1]}
  for j = 2, h do ms[j] = ARGV[1] .. '.' .. j end
  if redis.call('ZREM', key, unpack(ms)) == 0 then
    redis.call('ZADD', key, 0, ARGV[1])
    if redis.call('PTTL', key) < 0 then
      redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[2 * i + 2]) / 1000) + tonumber(ARGV[2]))
    end
  end
end
return 1
`

// script is one of the limiter's Lua scripts, called by EVALSHA of its
// source or, from the slidegate library (library.go), by FCALL of its
// function.
type script struct {
	src string
	sha string
	fn  string // the library's function (versioned name)
	// The two arguments that name it, boxed once (see argEvalSha).
	shaArg, fnArg any
}

func newScript(src, fn string) script {
	h := sha1.Sum([]byte(src)) //nolint:gosec // see import
	sha := hex.EncodeToString(h[:])
	return script{src: src, sha: sha, fn: fn, shaArg: sha, fnArg: fn}
}

var (
	decideLua = newScript(decideScript, "slidegate_decide_v1")
	undoLua   = newScript(undoScript, "slidegate_undo_v1")
	cancelLua = newScript(cancelScript, "slidegate_cancel_v1")
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

// DecideScript returns the Lua source of the decide script, so that a
// benchmark can run the very same script outside the limiter (e.g. with
// redis-benchmark) to measure the server's ceiling.
func DecideScript() string { return decideScript }

// The layout of the two scripts' commands and of the decide reply, as the
// comments on decideScript and undoScript document it. Nothing outside the
// functions below indexes into a command or a reply.
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
	flagCounter = 1 // SlidingWindowCounter instead of SlidingLog
	flagDryRun  = 2 // a denial here does not stop the group's commit
)

// Arguments boxed once: converting a string to any allocates, and these
// recur in every command.
var (
	argEvalSha = any("evalsha")
	argFCall   = any("fcall")
	// argCommit is ARGV[3], indexed by whether the script may admit.
	argCommit = [2]any{"0", "1"}
	// argKeyFlags is a key's flags argument, indexed by its flags.
	argKeyFlags = [flagCounter | flagDryRun + 1]any{"0", "1", "2", "3"}
	argOneHit   = any("1")
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
		if r.Rule.Algorithm == SlidingWindowCounter {
			f |= flagCounter
		}
		if r.DryRun {
			f |= flagDryRun
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
	key     string
	counter bool  // a SlidingWindowCounter key
	field   int64 // the counter field it incremented (counter only)
	hits    int64
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
		if k.counter {
			field = strconv.FormatInt(k.field, 10)
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
		if rep.keys[k].allowed {
			undo = append(undo, undoKey{key: dk.key, counter: dk.flags&flagCounter != 0, field: rep.keys[k].field, hits: dk.hits})
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
		if k.flags&flagCounter == 0 {
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
