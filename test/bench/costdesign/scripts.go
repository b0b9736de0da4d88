package main

// The prototypes of issue 27's weighted sliding log, as EVAL scripts.
// They are not the library's: each takes the clock from ARGV (a synthetic
// clock makes every admit of the steady state trim exactly one member, so
// designs are compared at the same live count whatever the machine's
// speed), and they leave out what every design shares with today's
// decideScript (argument bounds, replay, reply layout).
//
// Common ARGV: now µs, window µs, limit, cost, member id (8 bytes, as
// limiter.nextMember). KEYS[1] is the log (a sorted set scored by admit
// time); KEYS[2], where a design has it, is a string key in the same hash
// slot ("<key>s": the key's {tag} is kept) holding the running sum.
// Each admit script returns 1 (admitted) or 0 (denied).

// countLua is today's SlidingLog path of decideScript, one member per
// admit: trim, count, admit, expiry.
const countLua = `
local now, w, l = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - w)
local c = redis.call('ZCARD', KEYS[1])
if c + 1 > l then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[5])
redis.call('PEXPIRE', KEYS[1], math.ceil(w / 1000) + 1000)
return 1
`

// sumLua is design (a): the member is the id followed by its weight in
// decimal (the id is 8 bytes, so no separator), and KEYS[2] holds the sum
// of the live members. The trim reads the members that leave, subtracts
// their weights, then removes them; the admit adds its member with ZADD NX
// and adds its weight only when the member was new (a resent call adds
// nothing). need = max(cost, 1): a check with an unknown cost (0) admits
// while the sum is under the limit.
const sumLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cut = now - w
local s = tonumber(redis.call('GET', KEYS[2]) or '0')
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cut)
if #gone > 0 then
  for _, m in ipairs(gone) do s = s - tonumber(string.sub(m, 9)) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cut)
end
local ttl = math.ceil(w / 1000) + 1000
if s + math.max(x, 1) > l then
  if #gone > 0 then redis.call('SET', KEYS[2], s, 'PX', ttl) end
  return 0
end
if x > 0 and redis.call('ZADD', KEYS[1], 'NX', now, ARGV[5] .. ARGV[4]) == 1 then s = s + x end
redis.call('SET', KEYS[2], s, 'PX', ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
`

// indexLua is design (d): design (a), plus an index of prefix sums for
// the retry: KEYS[3] ("<key>p") is a second sorted set of the same
// members scored by T-after, the total cost admitted into the key up to
// and including the member (T is the newest entry's score; it restarts
// at 0 when the key empties). Its order is the log's, so the trim drops
// the same number of its first entries; and the member whose leaving
// makes room is the first entry at or above a target (retryIndexLua), one
// O(log n) lookup. The member is still id+weight, a function of the
// call's arguments, so a resent call's ZADD NX finds it.
const indexLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cut = now - w
local s = tonumber(redis.call('GET', KEYS[2]) or '0')
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cut)
if #gone > 0 then
  for _, m in ipairs(gone) do s = s - tonumber(string.sub(m, 9)) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cut)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, #gone - 1)
end
local ttl = math.ceil(w / 1000) + 1000
if s + math.max(x, 1) > l then
  if #gone > 0 then redis.call('SET', KEYS[2], s, 'PX', ttl) end
  return 0
end
if x > 0 then
  local m = ARGV[5] .. ARGV[4]
  if redis.call('ZADD', KEYS[1], 'NX', now, m) == 1 then
    s = s + x
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('ZADD', KEYS[3], (tonumber(last[2]) or 0) + x, m)
  end
end
redis.call('SET', KEYS[2], s, 'PX', ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return 1
`

// retryIndexLua is design (d)'s exact retry: the live members' prefix
// sums start after T-before of the oldest entry; the first entry whose
// T-after reaches that plus s+need-l is the member whose leaving makes
// room. Reply as retryWalkLua (commands of O(log n) each).
const retryIndexLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local s = tonumber(redis.call('GET', KEYS[2]) or '0')
local need = math.max(x, 1)
if s + need <= l then return {0, 1} end
if need > l then return {w, 1} end
local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local target = tonumber(first[2]) - tonumber(string.sub(first[1], 9)) + s + need - l
local r = redis.call('ZRANGE', KEYS[3], string.format('%d', target), '+inf', 'BYSCORE', 'LIMIT', 0, 1)
if not r[1] then return {w, 3} end
return {tonumber(redis.call('ZSCORE', KEYS[1], r[1])) + w - now, 4}
`

// twinLua is design (e): today's count log unchanged (member = the 8-byte
// id, scored by admit time) plus a twin sorted set KEYS[3] ("<key>p") of
// the same ids scored by T-after (the cost admitted into the key up to
// and including the member), and KEYS[2] holding b, T-before of the
// oldest live member. The window's sum is T (the twin's last score) - b;
// a weight is the difference of two neighbouring twin scores, so no
// member carries it. The trim is today's ZREMRANGEBYSCORE, whose count g
// says how many of the twin's first entries leave: b becomes the score of
// the last of them. Admit scores never go below the log's newest (a clock
// stepping back would otherwise reorder the log against the twin).
const twinLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local g = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - w)
local b = tonumber(redis.call('GET', KEYS[2]) or '0')
local ttl = math.ceil(w / 1000) + 1000
if g > 0 then
  b = tonumber(redis.call('ZRANGE', KEYS[3], g - 1, g - 1, 'WITHSCORES')[2])
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, g - 1)
end
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local t = tonumber(last[2]) or b
if t - b + math.max(x, 1) > l then
  if g > 0 then redis.call('SET', KEYS[2], b, 'PX', ttl) end
  return 0
end
if x > 0 and redis.call('ZADD', KEYS[1], 'NX', now, ARGV[5]) == 1 then
  redis.call('ZADD', KEYS[3], t + x, ARGV[5])
  redis.call('PEXPIRE', KEYS[3], ttl)
end
if g > 0 then redis.call('SET', KEYS[2], b, 'PX', ttl) else redis.call('PEXPIRE', KEYS[2], ttl) end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
`

// retryTwinLua is design (e)'s exact retry: the first twin entry whose
// T-after reaches T + need - l; its admit time is its score in the log.
// Reply as retryWalkLua (commands of O(log n) each).
const retryTwinLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local b = tonumber(redis.call('GET', KEYS[2]) or '0')
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
local t = tonumber(last[2]) or b
local need = math.max(x, 1)
if t - b + need <= l then return {0, 2} end
if need > l then return {w, 2} end
local r = redis.call('ZRANGE', KEYS[3], string.format('%d', t + need - l), '+inf', 'BYSCORE', 'LIMIT', 0, 1)
if not r[1] then return {w, 3} end
return {tonumber(redis.call('ZSCORE', KEYS[1], r[1])) + w - now, 4}
`

// checkpointLua is design (f): design (a) (member = id + weight, the
// running sum), plus a sparse index of prefix sums for the retry: every
// 32nd admit is also written to KEYS[3] ("<key>p"), scored by its T-after
// (the cost admitted into the key up to and including it). KEYS[2] is a
// hash: s the live sum, t the total T (T-after of the newest admit), k
// the admits since the last checkpoint. T-before of the oldest live
// member is t-s, so the trim drops the checkpoints at or below it. The
// retry (retryCheckpointLua) starts from the last checkpoint below its
// target and walks at most about 32 members.
const checkpointLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cut = now - w
local v = redis.call('HMGET', KEYS[2], 's', 't', 'k')
local s, t, k = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', cut)
if #gone > 0 then
  for _, m in ipairs(gone) do s = s - (tonumber(string.sub(m, 9)) or 0) end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cut)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%d', t - s))
end
local ttl = math.ceil(w / 1000) + 1000
if s + math.max(x, 1) > l then
  if #gone > 0 then redis.call('HSET', KEYS[2], 's', s) end
  return 0
end
if x > 0 then
  local m = ARGV[5] .. ARGV[4]
  if redis.call('ZADD', KEYS[1], 'NX', now, m) == 1 then
    s, t, k = s + x, t + x, k + 1
    if k >= 32 then
      redis.call('ZADD', KEYS[3], t, m)
      redis.call('PEXPIRE', KEYS[3], ttl)
      k = 0
    end
  end
end
redis.call('HSET', KEYS[2], 's', s, 't', t, 'k', k)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
`

// retryCheckpointLua is design (f)'s exact retry: the member whose
// T-after first reaches T+need-l, found by walking the log from the last
// checkpoint below that target (or from the oldest live member). Reply
// as retryWalkLua.
const retryCheckpointLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local v = redis.call('HMGET', KEYS[2], 's', 't')
local s, t = tonumber(v[1]) or 0, tonumber(v[2]) or 0
local need = math.max(x, 1)
if s + need <= l then return {0, 0} end
if need > l then return {w, 0} end
local target = t + need - l
local from = redis.call('ZCOUNT', KEYS[1], '-inf', now - w)
local acc = t - s
local cp = redis.call('ZRANGE', KEYS[3], '(' .. string.format('%d', target), '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1, 'WITHSCORES')
if cp[1] then
  from = redis.call('ZRANK', KEYS[1], cp[1]) + 1
  acc = tonumber(cp[2])
end
local read, chunk = 0, 8
while true do
  local r = redis.call('ZRANGE', KEYS[1], from, from + chunk - 1, 'WITHSCORES')
  if #r == 0 then return {w, read} end
  for j = 1, #r, 2 do
    read = read + 1
    acc = acc + (tonumber(string.sub(r[j], 9)) or 0)
    if acc >= target then return {tonumber(r[j + 1]) + w - now, read} end
  end
  from = from + chunk
  chunk = 32
end
`

// rescanLua is design (b): no running sum; each decision sums the
// weights of every live member.
const rescanLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - w)
local s = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do s = s + tonumber(string.sub(m, 9)) end
if s + math.max(x, 1) > l then return 0 end
if x > 0 then redis.call('ZADD', KEYS[1], 'NX', now, ARGV[5] .. ARGV[4]) end
redis.call('PEXPIRE', KEYS[1], math.ceil(w / 1000) + 1000)
return 1
`

// prefixLua is design (c): prefix sums. KEYS[2] holds T, the total cost
// ever admitted into the key; each member is the id, T before its admit,
// ":" and its weight. The window's sum is T minus the oldest live
// member's T-before, so the trim never reads what leaves (one ZRANGE of
// the oldest), and the retry can binary-search the ranks (retryBisectLua)
// since T-after grows with the rank.
const prefixLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - w)
local t = tonumber(redis.call('GET', KEYS[2]) or '0')
local s = 0
local first = redis.call('ZRANGE', KEYS[1], 0, 0)
if first[1] then
  local m = first[1]
  local colon = string.find(m, ':', 9, true)
  s = t - tonumber(string.sub(m, 9, colon - 1))
end
if s + math.max(x, 1) > l then return 0 end
local ttl = math.ceil(w / 1000) + 1000
if x > 0 and redis.call('ZADD', KEYS[1], 'NX', now, ARGV[5] .. t .. ':' .. ARGV[4]) == 1 then
  redis.call('SET', KEYS[2], t + x, 'PX', ttl)
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 1
`

// counterLua is today's SlidingWindowCounter admit with HINCRBY by the
// cost (question 4): the estimate prev×(1-elapsed/w)+cur, one field per
// fixed window.
const counterLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local i = math.floor(now / w)
local v = redis.call('HMGET', KEYS[1], i, i - 1)
local c, p = tonumber(v[1]) or 0, tonumber(v[2]) or 0
local e = p * (w - (now - i * w)) / w + c
if e + math.max(x, 1) > l then return 0 end
if x > 0 then
  local n = redis.call('HINCRBY', KEYS[1], i, x)
  if n == x and redis.call('HLEN', KEYS[1]) > 2 then
    for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
      local fn = tonumber(f)
      if fn and fn ~= i and fn ~= i - 1 then redis.call('HDEL', KEYS[1], f) end
    end
  end
end
redis.call('PEXPIRE', KEYS[1], math.ceil((2 * w - (now - i * w)) / 1000) + 1000)
return 1
`

// retryWalkLua is the exact retry of designs (a) and (b): walk from the
// oldest live member, 8 at a time then twice as many each step up to 512, until enough weight has left that
// the window's sum s (ARGV[6]) plus need fits the limit; the member whose
// leaving does it sets the time. Reply: retry µs, members read.
const retryWalkLua = `
local now, w, l, x, s = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local need = s + math.max(x, 1) - l
if need <= 0 then return {0, 0} end
if math.max(x, 1) > l then return {w, 0} end
local from, read, chunk = redis.call('ZCOUNT', KEYS[1], '-inf', now - w), 0, 8
while true do
  local r = redis.call('ZRANGE', KEYS[1], from, from + chunk - 1, 'WITHSCORES')
  if #r == 0 then return {w, read} end
  for j = 1, #r, 2 do
    read = read + 1
    need = need - tonumber(string.sub(r[j], 9))
    if need <= 0 then return {tonumber(r[j + 1]) + w - now, read} end
  end
  from = from + chunk
  if chunk < 512 then chunk = chunk * 2 end
end
`

// retryBisectLua is the exact retry of design (c): the first rank whose
// T-after (T-before + weight) reaches T + need - l, by bisection over
// the live ranks, one ZRANGE of one member per probe. Reply as
// retryWalkLua (members read = probes).
const retryBisectLua = `
local now, w, l, x = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = tonumber(redis.call('GET', KEYS[2]) or '0')
local lo = redis.call('ZCOUNT', KEYS[1], '-inf', now - w)
local hi = redis.call('ZCARD', KEYS[1]) - 1
local need = math.max(x, 1)
if need > l or hi < lo then return {w, 0} end
local probes = 0
-- at reads rank r: T before its admit, its weight, its score.
local function at(r)
  probes = probes + 1
  local m = redis.call('ZRANGE', KEYS[1], r, r, 'WITHSCORES')
  local colon = string.find(m[1], ':', 9, true)
  return tonumber(string.sub(m[1], 9, colon - 1)), tonumber(string.sub(m[1], colon + 1)), tonumber(m[2])
end
local tb, w0, sc0 = at(lo)
if t - tb + need <= l then return {0, probes} end
local target = t + need - l
if tb + w0 >= target then return {sc0 + w - now, probes} end
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  local b, wt = at(mid)
  if b + wt >= target then hi = mid else lo = mid + 1 end
end
local b, wt, score = at(lo)
if b + wt < target then return {w, probes} end
return {score + w - now, probes}
`
