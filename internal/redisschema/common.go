package redisschema

// commonLua opens every script that decides or reads a window: the clock,
// the bounds of a rule's arguments and the counter's retry, written once
// so that what a decision admits, what a batch admits and what a peek
// predicts cannot drift apart. Each script carries its own copy of the
// text (EVALSHA runs one script's source alone; a library function's body
// is one script).
const commonLua = `
-- clock is Redis's time in µs since ScoreEpoch: never the caller's.
local function clock()
  local t = redis.call('TIME')
  return (tonumber(t[1]) - 1577836800) * 1000000 + tonumber(t[2])
end

-- outOfRange reports a rule's arguments that no caller sends: a window of
-- 1 ms to a year (in µs), flags 0-15 (a charge only on a weighted key), a
-- limit that is a number, and 1 to 1000 hits, or for a weighted key a
-- cost of 0 to 10^9 (a sum, not members: one member whatever the cost).
local function outOfRange(l, w, f, h)
  if not l or not w or w < 1000 or w > 31536000000000 or not f or f < 0 or f > 15 or not h then return true end
  if f % 8 >= 4 then return h < 0 or h > 1000000000 or h % 1 ~= 0 end
  return f >= 8 or h < 1 or h > 1000
end

-- qstart is the start, in µs since ScoreEpoch, of the period a calendar
-- key names: its last '.' and the Unix ms after it; nil if it names none.
local function qstart(key)
  local ms = tonumber(string.match(key, '%.(%d+)$'))
  if not ms then return nil end
  return (ms - 1577836800000) * 1000
end

-- reply appends one key's five reply values to out: allowed, remaining
-- (none below 0), retry-after and reset-after in µs, counter field.
local function reply(out, ok, rem, retry, reset, field)
  local o = #out
  if rem < 0 then rem = 0 end
  out[o + 1] = ok and 1 or 0
  out[o + 2] = rem
  out[o + 3] = retry
  out[o + 4] = reset
  out[o + 5] = field
end

-- counterAdd adds h hits (hs, as sent) to field x (xs) of a counter key
-- and returns the field's count. A new field drops those older than the
-- previous window, which no estimate reads again.
local function counterAdd(key, x, xs, h, hs)
  local c = redis.call('HINCRBY', key, xs, hs)
  if c == h and redis.call('HLEN', key) > 2 then
    for _, f in ipairs(redis.call('HKEYS', key)) do
      local fn = tonumber(f)
      if fn and fn ~= x and fn ~= x - 1 then redis.call('HDEL', key, f) end
    end
  end
  return c
end

-- counterReset is how long until a counter key with count c in this fixed
-- window (elapsed into it) and p in the previous one weighs nothing: a
-- window from now when this one counts, else the previous one's end.
local function counterReset(w, c, p, elapsed)
  if c > 0 then return w end
  if p > 0 then return w - elapsed end
  return 0
end

-- counterRetry is how long, in µs, until a SlidingWindowCounter key with
-- count c in this fixed window (elapsed into it) and p in the previous one
-- has room for h more under limit l: first the previous window's weight
-- leaves, then this window's own count becomes the previous one.
local function counterRetry(l, w, h, c, p, elapsed)
  local retry
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
  return retry
end

-- logReset is how long, in µs, until a count log key holding c live
-- admits holds none: its newest admit's leaving.
local function logReset(key, c, w, now)
  if c < 1 then return 0 end
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return tonumber(last[2]) + w - now
end

-- logRetry is how long, in µs, until a count log key holding c live
-- admits (scored above cut, given as '(<µs>') has room for h more under
-- limit l: until the admit at rank c+h-l-1 of the window leaves. It reads
-- the window by score, so members that left it and are not trimmed yet
-- do not shift the rank.
local function logRetry(key, cut, c, h, l, w, now)
  local r = {}
  if l >= h then r = redis.call('ZRANGE', key, cut, '+inf', 'BYSCORE', 'LIMIT', c + h - l - 1, 1, 'WITHSCORES') end
  if r[2] then return tonumber(r[2]) + w - now end
  return w
end

-- A weighted SlidingLog key (flag 4: the limit counts cost, e.g. tokens)
-- is three keys of one slot:
--   key        sorted set, one member per admit or charge, named
--              '<decision member>|<cost>' and scored by its time in µs;
--              scores strictly increase (max(now, newest+1)), so that the
--              order of scores is the order of admits whatever the clock
--              (a cancel's placeholder alone sits at 0, counted nowhere);
--   key..'s'   hash: s the live cost, t the cost ever admitted, k the
--              admits since the last checkpoint, n the newest score;
--   key..'p'   sorted set of checkpoints: every 32nd admit's score (as the
--              member), scored by t just after it, so that an exact retry
--              reads one checkpoint and at most ~32 members, however deep
--              the key is in debt (docs/design/cost-limits.md, design f).
-- What leaves the window is read (its cost subtracted) when a call first
-- meets the key and removed at the call's end (wsave), after the admits:
-- a cancel's placeholder must still be there for its own late decision.
-- wCap bounds a weighted log's live members: an admit fits under the
-- limit (at most 10^6, the API's bound) with a cost of at least 1, but a
-- charge counts past it, so a caller charging without end (whoever reaches
-- the rate limit service) would grow the key without bound. A charge at
-- the cap is not written: the key is then at least wCap-limit in debt.
local wEvery, wChunk, wCap = 32, 256, 1000000

-- wcost is the cost a weighted member's name carries.
local function wcost(m) return tonumber(string.match(m, '|(%d+)$')) or 0 end

local function wint(v) return string.format('%d', v) end

-- wload reads a weighted key as of now, for window w.
local function wload(key, w, now)
  local v = redis.call('HMGET', key .. 's', 's', 't', 'k', 'n')
  local st = {s = tonumber(v[1]) or 0, t = tonumber(v[2]) or 0, k = tonumber(v[3]) or 0,
    n = tonumber(v[4]) or 0, exists = v[1] ~= false, cut = now - w, w = w, added = false, left = false}
  local lo = '(0'
  while true do
    local r = redis.call('ZRANGE', key, lo, st.cut, 'BYSCORE', 'LIMIT', 0, wChunk, 'WITHSCORES')
    if #r > 0 then st.left = true end
    for i = 1, #r, 2 do st.s = st.s - wcost(r[i]) end
    if #r < 2 * wChunk then break end
    lo = '(' .. r[#r]
  end
  if st.s < 0 then st.s = 0 end
  return st
end

-- wadmit adds member m of cost c (c > 0) to a weighted key at now; a
-- charge only below wCap members.
local function wadmit(key, st, m, c, now, charge)
  if charge and redis.call('ZCARD', key) >= wCap then return end
  local sc = math.max(now, st.n + 1)
  redis.call('ZADD', key, wint(sc), m)
  st.s, st.t, st.k, st.n, st.added = st.s + c, st.t + c, st.k + 1, sc, true
  if st.k >= wEvery then
    redis.call('ZADD', key .. 'p', wint(st.t), wint(sc))
    st.k = 0
  end
end

-- wretry is how long, in µs, until a weighted key has room for need
-- (1 for a check) under limit l: until the admits of total cost
-- s+need-l have left, oldest first; the one whose leaving does it is the
-- first whose t-after reaches t+need-l.
local function wretry(key, st, need, l, now)
  if need > l then return st.w end
  local target = st.t + need - l
  local lo, T = st.cut, st.t - st.s
  local cp = redis.call('ZRANGE', key .. 'p', '(' .. wint(target), '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
  if cp[2] and tonumber(cp[2]) > T then lo, T = tonumber(cp[1]), tonumber(cp[2]) end
  -- The target lies within the next wEvery members but for undone or
  -- trimmed checkpoints: read those first, then in chunks.
  local n = wEvery + 1
  while true do
    local r = redis.call('ZRANGE', key, '(' .. wint(lo), '+inf', 'BYSCORE', 'LIMIT', 0, n, 'WITHSCORES')
    for i = 1, #r, 2 do
      T = T + wcost(r[i])
      if T >= target then return tonumber(r[i + 1]) + st.w - now end
    end
    if #r < 2 * n then return st.w end
    lo, n = tonumber(r[#r]), wChunk
  end
end

-- wreset is how long until a weighted key holds nothing.
local function wreset(st, now)
  if st.s > 0 then return st.n + st.w - now end
  return 0
end

-- wsave removes what left the window and the checkpoints of admits that
-- left, and writes the state back; a key the call admitted into lives
-- its window and margin (ms) past its newest admit.
local function wsave(key, st, margin)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', wint(st.cut))
  -- A call that admitted nothing and saw nothing leave (a check, a
  -- denial) writes nothing more: no replication or AOF traffic for a
  -- client in debt that keeps asking.
  if not st.added and not (st.left and st.exists) then return end
  if st.t > 1125899906842624 then
    -- t grows while the key never empties; rebase it (and the
    -- checkpoints) long before a double loses whole numbers (2^53).
    local d = st.t - st.s
    local cps = redis.call('ZRANGE', key .. 'p', 0, -1, 'WITHSCORES')
    for i = 1, #cps, 2 do redis.call('ZADD', key .. 'p', wint(tonumber(cps[i + 1]) - d), cps[i]) end
    st.t = st.s
  end
  redis.call('ZREMRANGEBYSCORE', key .. 'p', '-inf', wint(st.t - st.s))
  redis.call('HSET', key .. 's', 's', wint(st.s), 't', wint(st.t), 'k', wint(st.k), 'n', wint(st.n))
  if st.added then
    local ms = math.ceil(st.w / 1000) + margin
    redis.call('PEXPIRE', key, ms)
    redis.call('PEXPIRE', key .. 's', ms)
    redis.call('PEXPIRE', key .. 'p', ms)
  end
end

-- wundo takes back member m of cost c from a weighted key, if there: the
-- sums and the checkpoints after it are lowered by c. Run twice, the
-- second finds nothing.
local function wundo(key, m, c)
  local sc = redis.call('ZSCORE', key, m)
  if not sc then return false end
  redis.call('ZREM', key, m)
  sc = tonumber(sc)
  if sc <= 0 or c <= 0 or redis.call('PTTL', key .. 's') == -2 then return true end
  redis.call('HINCRBY', key .. 's', 's', -c)
  redis.call('HINCRBY', key .. 's', 't', -c)
  local off = 0
  while true do
    local r = redis.call('ZRANGE', key .. 'p', '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', off, 32, 'WITHSCORES')
    for i = 1, #r, 2 do
      local at = tonumber(r[i])
      if at < sc then return true end
      if at == sc then
        redis.call('ZREM', key .. 'p', r[i])
      else
        redis.call('ZADD', key .. 'p', 'XX', wint(tonumber(r[i + 1]) - c), r[i])
      end
    end
    if #r < 64 then return true end
    off = off + 32
  end
end
`
