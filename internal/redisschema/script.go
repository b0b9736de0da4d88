package redisschema

// ScoreEpoch is the origin of the scores, in Unix seconds (2020-01-01 UTC).
// Microseconds since then stay below 2^53 (exact as Lua doubles and as
// sorted-set scores) for about 285 years, where Unix microseconds would
// leave only a factor of five.
const ScoreEpoch = 1577836800

// decideScript decides every rule of one request whose keys share a slot,
// in one atomic step, with the time of the Redis server (TIME), never the
// caller's: sidecars with skewed clocks still agree.
//
// The arguments are checked first (at most 1024 keys, hits in
// [1, limiter.MaxHits], windows in [1 ms, 1 year]), as in undoScript and
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
// Flags: 1 a SlidingWindowCounter key, 2 dry run, 4 weighted, 8 a weighted
// charge, 16 a calendar key (with 2 at most).
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
// A calendar key (flag 16) counts one period of a quota: a hash whose
// field "0" is the period's admits (and "u" undoScript's), named by the
// period it counts, [start, start+window), its start in Unix ms after the
// key's last '.'. It is counted only while Redis's clock is in that
// period: a key that names another period (the caller guessed the period
// from a clock on the other side of a boundary) is denied and counts
// nothing, its reply's field -1 (the caller asks again, in the period of
// the reply's now), with a retry of the time until its period starts, or
// 1 ms when it is over. So a period's admits are those made while Redis's
// clock was in it, at most the limit, whatever the callers' clocks. It
// expires with its period (and the margin). Flag 16 is the decide
// function's only addition since slidegate_decide_v1 was named: every
// call it took before means what it meant, and a library without it
// refuses flag 16 (out of range), which the rule's fail mode decides.
//
// A committing call first looks for its own member in its SlidingLog keys:
// found, the decision was already admitted (go-redis re-ran the script
// after losing its reply, or a cancel ran first) and the script admits
// nothing, replying committed as the first run did. A counter key keeps no
// members, so a rerun of a decision with only counter keys counts it twice:
// a marker per key would have cost every counter key a third more memory
// (104 → 136 B per client), for a rare lost reply on Redis Cluster, and
// would only remember the key's last admit.
const decideScript = commonLua + `
local n = #KEYS
if n < 1 or n > 1024 or #ARGV ~= 3 + 4 * n or not tonumber(ARGV[2]) then
  return redis.error_reply('ERR slidegate: malformed decide call')
end
for i = 1, n do
  local b = 4 * i
  local f = tonumber(ARGV[b + 2])
  -- A calendar key counts requests: with a dry run at most, and a period.
  if f and f >= 16 and ((f ~= 16 and f ~= 18) or not qstart(KEYS[i])) then f = nil end
  if f and f >= 16 then f = f - 16 end
  if outOfRange(tonumber(ARGV[b]), tonumber(ARGV[b + 1]), f, tonumber(ARGV[b + 3])) then
    return redis.error_reply('ERR slidegate: decide argument out of range')
  end
end
local now = clock()
local member = ARGV[1]
local margin = tonumber(ARGV[2])

-- wname is the member of this decision in a weighted log key (flags f,
-- cost h): the cost in its name (see commonLua); a check writes none.
local function wname(f, h)
  if f % 2 == 0 and f % 8 >= 4 and h > 0 then return member .. '|' .. wint(h) end
  return nil
end

-- mine reports whether this decision already admitted into key (a
-- SlidingLog key; a counter key keeps no members).
local function mine(key, f, h)
  if f % 2 == 1 or f >= 16 then return false end
  if f % 8 >= 4 then
    local m = wname(f, h)
    return m ~= nil and redis.call('ZSCORE', key, m) ~= false
  end
  return redis.call('ZSCORE', key, member) ~= false
end

-- The weighted log keys this call read, in order, and their states.
local wkeys, wsts = {}, {}
-- done writes back the weighted keys' states, then returns out.
local function done(out)
  for _, key in ipairs(wkeys) do wsave(key, wsts[key], margin) end
  return out
end

-- check trims and counts one key: allowed, estimate/count, counter field,
-- current and previous fixed-window counts. A weighted key's need is its
-- cost, or 1 for a check (cost 0); a charge (flag 8) is always allowed.
local function check(key, l, w, f, h)
  if f >= 16 then
    local s = qstart(key)
    -- x -1: the key names a period that does not hold now.
    if now < s or now >= s + w then return false, 0, -1, 0, 0 end
    local c = tonumber(redis.call('HGET', key, '0')) or 0
    return c + h <= l, c, 0, c, 0
  end
  local ctr = f % 2 == 1
  local need = h
  if f % 8 >= 4 and h < 1 then need = 1 end
  if ctr then
    local x = math.floor(now / w)
    local v = redis.call('HMGET', key, x, x - 1)
    local c, p = tonumber(v[1]) or 0, tonumber(v[2]) or 0
    local e = p * (w - (now - x * w)) / w + c
    return f >= 8 or e + need <= l, e, x, c, p
  end
  if f % 8 >= 4 then
    local ws = wsts[key]
    if not ws then
      ws = wload(key, w, now)
      wsts[key] = ws
      wkeys[#wkeys + 1] = key
    end
    return f >= 8 or ws.s + need <= l, ws.s, 0, ws.s, 0
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - w)
  local c = redis.call('ZCARD', key)
  return c + h <= l, c, 0, c, 0
end

-- finish admits into one key when commit, sets its expiry and appends
-- its five reply values to out.
local function finish(out, key, l, w, f, h, ok, commit, e, x, c, p)
  if f >= 16 then
    local s = qstart(key)
    if x == -1 then
      local retry = 1000
      if now < s then retry = s - now end
      reply(out, false, 0, retry, 0, -1)
      return
    end
    local left = s + w - now
    if commit then
      redis.call('HINCRBY', key, '0', h)
      redis.call('PEXPIRE', key, math.ceil(left / 1000) + margin)
      c = c + h
    end
    local retry, reset = 0, 0
    if not ok then retry = left end
    if c > 0 then reset = left end
    reply(out, ok, l - c, retry, reset, 0)
    return
  end
  local ctr = f % 2 == 1
  local rem, retry, reset, field = 0, 0, 0, 0
  local exists = commit
  local ttl = w
  if ctr then
    local elapsed = now - x * w
    -- This window's count weighs on the next one until that one ends.
    ttl = 2 * w - elapsed
    if commit and h > 0 then
      counterAdd(key, x, x, h, h)
      c, e, field = c + h, e + h, x
    end
    rem = math.floor(l - e)
    reset = counterReset(w, c, p, elapsed)
    exists = (exists and h > 0) or c > 0 or p > 0
    if not ok then retry = counterRetry(l, w, math.max(h, 1), c, p, elapsed) end
  elseif f % 8 >= 4 then
    -- A weighted log: wsave (done) trims it and sets its expiry.
    local ws = wsts[key]
    local m = commit and wname(f, h)
    if m then
      wadmit(key, ws, m, h, now, f >= 8)
      c = c + h
    end
    rem = l - c
    reset = wreset(ws, now)
    if not ok then retry = wretry(key, ws, math.max(h, 1), l, now) end
    reply(out, ok, rem, retry, reset, field)
    return
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
    else
      reset = logReset(key, c, w, now)
    end
    exists = exists or c > 0
    if not ok then retry = logRetry(key, '(' .. wint(now - w), c, h, l, w, now) end
    rem = l - c
  end
  if exists then redis.call('PEXPIRE', key, math.ceil(ttl / 1000) + margin) end
  reply(out, ok, rem, retry, reset, field)
end

-- replay answers a decision already admitted: committed, each key as it
-- now stands (counting the admit), allowed where it was admitted.
local function replay()
  local out = {now, 1}
  for i = 1, #KEYS do
    local b = 4 * i
    local l, w, f, h = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    local _, e, x, c, p = check(KEYS[i], l, w, f, h)
    -- The first run committed: every rule but the dry-run ones admitted.
    local ok = mine(KEYS[i], f, h) or f % 4 < 2
    finish(out, KEYS[i], l, w, f, h, ok, false, e, x, c, p)
    if ok and f % 2 == 1 then out[#out] = x end
  end
  return done(out)
end

local pass = ARGV[3] == '1'
if pass then
  for i = 1, n do
    if mine(KEYS[i], tonumber(ARGV[4 * i + 2]), tonumber(ARGV[4 * i + 3])) then return replay() end
  end
end
if n == 1 then
  -- The common case, without the per-key tables.
  local key, l, w, f, h = KEYS[1], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local ok, e, x, c, p = check(key, l, w, f, h)
  pass = pass and (ok or f % 4 >= 2)
  local out = {now, pass and 1 or 0}
  finish(out, key, l, w, f, h, ok, pass and ok, e, x, c, p)
  return done(out)
end
local lim, win, fl, hs, oks, es, xs, cs, ps = {}, {}, {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  local b = 4 * i
  local l, w, f, h = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  lim[i], win[i], fl[i], hs[i] = l, w, f, h
  oks[i], es[i], xs[i], cs[i], ps[i] = check(KEYS[i], l, w, f, h)
  if not oks[i] and f % 4 < 2 then pass = false end
end
local out = {now, pass and 1 or 0}
for i = 1, n do
  finish(out, KEYS[i], lim[i], win[i], fl[i], hs[i], oks[i], pass and oks[i], es[i], xs[i], cs[i], ps[i])
end
return done(out)
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
//	ARGV[2i]    "" for a SlidingLog key, "w" for a weighted one, else the
//	            counter field incremented
//	ARGV[2i+1]  the hits that were added (a weighted key's cost)
const undoScript = commonLua + `
local n = #KEYS
if n < 1 or n > 1024 or #ARGV ~= 1 + 2 * n then
  return redis.error_reply('ERR slidegate: malformed undo call')
end
for i = 1, n do
  local h = tonumber(ARGV[2 * i + 1])
  -- Hits are members in a log key; a counter's or a weighted key's cost
  -- is a number.
  local most = 1000000000
  if ARGV[2 * i] == '' then most = 1000 end
  if not h or h < 1 or h > most or h % 1 ~= 0 then return redis.error_reply('ERR slidegate: undo argument out of range') end
end
for i = 1, n do
  local f, h = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  if f == 'w' then
    wundo(KEYS[i], ARGV[1] .. '|' .. wint(h), h)
  elseif f == '' then
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
//	ARGV[2i+1]  the key's hits ("w<cost>" for a weighted key), ARGV[2i+2]
//	            its window in µs
//
// A weighted key's member carries the cost ('<member>|<cost>'): found, it
// is taken back with its cost (wundo); absent, its placeholder at 0 counts
// in no sum.
const cancelScript = commonLua + `
local n = #KEYS
if n < 1 or n > 1024 or #ARGV ~= 2 + 2 * n or not tonumber(ARGV[2]) then
  return redis.error_reply('ERR slidegate: malformed cancel call')
end
local function hitsOf(a)
  if string.sub(a, 1, 1) == 'w' then return tonumber(string.sub(a, 2)), 4 end
  return tonumber(a), 0
end
for i = 1, n do
  local h, f = hitsOf(ARGV[2 * i + 1])
  if outOfRange(0, tonumber(ARGV[2 * i + 2]), f, h) or (f == 4 and h < 1) then
    return redis.error_reply('ERR slidegate: cancel argument out of range')
  end
end
for i = 1, n do
  local key, h, f = KEYS[i], hitsOf(ARGV[2 * i + 1])
  if f == 4 then
    local m = ARGV[1] .. '|' .. wint(h)
    if not wundo(key, m, h) then
      redis.call('ZADD', key, 0, m)
      if redis.call('PTTL', key) < 0 then
        redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[2 * i + 2]) / 1000) + tonumber(ARGV[2]))
      end
    end
  else
    local ms = {ARGV[1]}
    for j = 2, h do ms[j] = ARGV[1] .. '.' .. j end
    if redis.call('ZREM', key, unpack(ms)) == 0 then
      redis.call('ZADD', key, 0, ARGV[1])
      if redis.call('PTTL', key) < 0 then
        redis.call('PEXPIRE', key, math.ceil(tonumber(ARGV[2 * i + 2]) / 1000) + tonumber(ARGV[2]))
      end
    end
  end
end
return 1
`
