package redisschema

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The packed log's call (issue 39): many decisions in one EVALSHA, in a
// format of its own, because the decide batch's (seven arguments and six
// reply values per decision) costs Redis about 2 µs per decision before
// any command runs (test/bench/luaab's floor:empty), as much as a fixed
// window's whole decision. A call's decisions mostly share a few rules, so
// each rule is sent once, a decision is one byte beside its key, and the
// reply is one string of fixed-width answers.

// packedCallScript decides a packed call.
//
//	KEYS      one key per decision
//	ARGV[1]   the expiry margin, ms
//	ARGV[2]   "1" when the client may run the call twice (a
//	          ClusterClient): every decision looks for its member
//	ARGV[3]   one byte per key: its rule's index (0-based, below 64), plus
//	          64 when the key belongs to the decision of the key before it,
//	          plus 128 when the decision only decides (admits nothing)
//	ARGV[4]   8 bytes per key: its decision's member
//	ARGV[5:]  the rules, three arguments each: limit, window µs, hits
//
// A decision's keys are judged first and written only if all of them
// allow it (all or nothing, as a decide batch's decision of several keys).
//
// Reply: one string, Redis's clock (µs since ScoreEpoch, 7 bytes) and
// then packedAnswerSize bytes per key (PackedCall.Decode).
const packedCallScript = commonLua + packedLogLua + `
local margin, now = tonumber(ARGV[1]), clock()
local look, sel, ms, rules = ARGV[2] == '1', ARGV[3], ARGV[4], {}
if not margin or not sel or #sel ~= #KEYS or not ms or #ms ~= 8 * #KEYS or #ARGV % 3 ~= 1 then return redis.error_reply('ERR slidegate: packed call arguments malformed') end
for r = 1, (#ARGV - 4) / 3 do
  local l, w, h = tonumber(ARGV[3 * r + 2]), tonumber(ARGV[3 * r + 3]), tonumber(ARGV[3 * r + 4])
  if outOfRange(l, w, 0, h) then return redis.error_reply('ERR slidegate: packed call rule out of range') end
  rules[r] = {l, w, h}
end
local out = {struct.pack('>I7', now)}
local nk, i = #KEYS, 1
local function rule(x)
  return rules[string.byte(sel, x) % 64 + 1], string.sub(ms, 8 * x - 7, 8 * x)
end
while i <= nk do
  local e = i
  while e < nk and string.byte(sel, e + 1) % 128 >= 64 do e = e + 1 end
  local commit = string.byte(sel, i) < 128
  if e == i then
    -- A decision of one key, most of them: no table.
    local r, m = rule(i)
    if not r then return redis.error_reply('ERR slidegate: packed call names no such rule') end
    local ok, rem, retry, reset, t, replay = pdecide(KEYS[i], r[1], r[2], r[3], commit, margin, now, m, look)
    if replay or (ok == 1 and commit) then ok = ok + 2 end
    out[i + 1] = struct.pack('>Bi4I6I6I7', ok, rem, retry, reset, t)
  else
    -- Judged first, written only if every key allows it.
    local judged, all = {}, true
    for x = i, e do
      local r, m = rule(x)
      if not r then return redis.error_reply('ERR slidegate: packed call names no such rule') end
      local a = {pjudge(KEYS[x], r[1], r[2], r[3], now, m, look)}
      a.r, a.m = r, m
      judged[x] = a
      all = all and a[1] == 1
    end
    for x = i, e do
      local a = judged[x]
      local done = a[6]
      if all and commit and not a[6] then
        pwrite(KEYS[x], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[5], a.r[3], a.m, a.r[1], a.r[2], margin, now)
        done = true
      elseif all and commit then
        done = true
      end
      out[x + 1] = struct.pack('>Bi4I6I6I7', a[1] + (done and 2 or 0), a[2], a[3], a[4], a[5])
    end
  end
  i = e + 1
end
return table.concat(out)
`

// PackedCallScript is the source of the packed call, for the benches.
func PackedCallScript() string { return packedCallScript }

// packedAnswerSize is the bytes of one key's answer in a packed call's
// reply: allowed and committed 1, remaining 4 (signed: a lowered limit
// leaves more live admits than it), retry-after and reset-after 6 each
// (µs, up to 8 years), the first instant 7.
const packedAnswerSize = 1 + 4 + 6 + 6 + 7

// maxPackedRules is how many rules one packed call names: a key's byte
// holds its rule's index below 64.
const maxPackedRules = 64

// PackedRule is the rule a packed call decides a key under.
type PackedRule struct {
	Limit  int64
	Window time.Duration
	Hits   int64
}

// PackedAnswer is one key's answer.
type PackedAnswer struct {
	// Allowed is the key's own answer: its live admits leave room for the
	// hits (or it was admitted before: a replay).
	Allowed bool
	// Committed says the decision's admits are in Redis: every key of the
	// decision allowed it and it admits (or they were written before, and
	// this is a replay).
	Committed  bool
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
	// Instant is the first hit's instant (µs since ScoreEpoch), what
	// takes the admit back once committed; 0 if not allowed.
	Instant int64
}

// PackedCall gathers the decisions of one packed call. The zero value,
// with Margin set, is ready; Reset makes it ready again.
type PackedCall struct {
	// Margin is how long a key outlives its newest admit's window.
	Margin time.Duration
	// Resends says the client may run a call twice (a ClusterClient
	// resends a script whose reply it lost): every decision then looks
	// for its member, and one that finds it admits nothing more. Without
	// it a decision looks only on keys that hold a cancel's placeholder.
	Resends bool
	keys    []string
	sel     []byte
	members []byte
	rules   []PackedRule
}

// ErrPackedCallFull is Add's error when the call names maxPackedRules
// rules already and the decision's is not one of them: send the call and
// Reset it.
var ErrPackedCallFull = errors.New("redisschema: a packed call names 64 rules")

// Add appends a decision of rule on key under member (8 bytes: what makes
// a decision that runs twice admit once, and what a cancel finds); commit
// admits its hits when allowed. AddKey adds more keys to it.
func (c *PackedCall) Add(key, member string, rule PackedRule, commit bool) error {
	if len(member) != 8 {
		return fmt.Errorf("redisschema: a packed call's member is 8 bytes, not %d", len(member))
	}
	return c.add(key, member, rule, commit, false)
}

// AddKey adds key under rule to the decision added last: its member, and
// all or nothing with its other keys. A decision's keys are distinct.
func (c *PackedCall) AddKey(key string, rule PackedRule) error {
	n := len(c.sel)
	if n == 0 {
		return errors.New("redisschema: AddKey before any Add")
	}
	return c.add(key, string(c.members[8*n-8:]), rule, c.sel[n-1]&0x80 == 0, true)
}

func (c *PackedCall) add(key, member string, rule PackedRule, commit, more bool) error {
	i := 0
	for i < len(c.rules) && c.rules[i] != rule {
		i++
	}
	if i == len(c.rules) {
		if i == maxPackedRules {
			return ErrPackedCallFull
		}
		c.rules = append(c.rules, rule)
	}
	b := byte(i)
	if more {
		b |= 0x40
	}
	if !commit {
		b |= 0x80
	}
	c.keys = append(c.keys, key)
	c.sel = append(c.sel, b)
	c.members = append(c.members, member...)
	return nil
}

// Reset empties the call, keeping its storage and Margin.
func (c *PackedCall) Reset() {
	c.keys, c.sel, c.members, c.rules = c.keys[:0], c.sel[:0], c.members[:0], c.rules[:0]
}

// Args is the call's KEYS and ARGV. The keys slice is the call's own:
// valid until the next Add or Reset.
func (c *PackedCall) Args() (keys []string, args []any) {
	args = make([]any, 0, 4+3*len(c.rules))
	resends := "0"
	if c.Resends {
		resends = "1"
	}
	args = append(args, strconv.FormatInt(c.Margin.Milliseconds(), 10), resends, string(c.sel), string(c.members))
	for _, r := range c.rules {
		args = append(args, strconv.FormatInt(r.Limit, 10), strconv.FormatInt(r.Window.Microseconds(), 10), strconv.FormatInt(r.Hits, 10))
	}
	return c.keys, args
}

// Decode reads a packed call's reply into answers (one per decision, in
// the order added), and returns Redis's clock at the call.
func (c *PackedCall) Decode(reply any, answers []PackedAnswer) (now int64, _ []PackedAnswer, err error) {
	s, ok := reply.(string)
	if !ok {
		return 0, answers, fmt.Errorf("redisschema: packed call replied %T, want a string", reply)
	}
	if len(s) != 7+packedAnswerSize*len(c.keys) {
		return 0, answers, fmt.Errorf("redisschema: packed call replied %d bytes for %d decisions, want %d", len(s), len(c.keys), 7+packedAnswerSize*len(c.keys))
	}
	now = beUint(s[:7])
	for i := range c.keys {
		a := s[7+packedAnswerSize*i:]
		answers = append(answers, PackedAnswer{
			Allowed:    a[0]&1 != 0,
			Committed:  a[0]&2 != 0,
			Remaining:  int64(int32(beUint(a[1:5]))), //nolint:gosec // the script packs it signed, 4 bytes
			RetryAfter: time.Duration(beUint(a[5:11])) * time.Microsecond,
			ResetAfter: time.Duration(beUint(a[11:17])) * time.Microsecond,
			Instant:    beUint(a[17:24]),
		})
	}
	return now, answers, nil
}

// beUint reads up to 8 bytes of s as a big-endian unsigned number.
func beUint(s string) int64 {
	var v uint64
	for i := range len(s) {
		v = v<<8 | uint64(s[i])
	}
	return int64(v) //nolint:gosec // at most 7 bytes
}
