package redisschema

// decideBatchScript decides, in one atomic call, every decision of a
// round trip whose keys share a slot (standalone: all of them): one TIME,
// one script call's overhead, and per decision only what exactness needs.
// Each decision is all-or-nothing on its own keys as in decideScript, on
// the same keys, members and hash fields, so limiters calling either share
// counts exactly (a mixed fleet while it upgrades).
//
//	KEYS           the keys of every decision, decision after decision
//	ARGV[1]        expiry margin in ms
//	then per decision:
//	  member, "1" to admit ("0" to only decide), its number of keys k,
//	  and per key: limit, window in µs, flags, hits (as decideScript)
//
// The arguments are checked before anything runs: at most 1024 keys and
// 65536 hits in all (a tenant may FCALL it directly with any arguments,
// and one call must not loop or allocate without bound).
//
// Reply: now, then per decision: committed, and per key its five values
// (decideScript's layout, without repeating now).
//
// What decideScript does per decision that this does not:
//   - no ZSCORE of its own member before deciding. A decision that already
//     admitted (go-redis resent the call after losing its reply, the
//     limiter resent it, or its cancel ran first and left the member with
//     score 0) is found where it would otherwise be wrong: its ZADD NX
//     adds nothing (the member is there), or, denied, it looks its member
//     up then. Either way it admits nothing more and answers as
//     decideScript's replay does. Live members are counted with ZCOUNT
//     over the window, and the trim runs after the admit, so a cancel's
//     score-0 member is still there to be found.
//   - no PEXPIRE on a denial: a denial writes nothing, and the expiry the
//     last admit set outlives every member. (Setting it only when a key is
//     new would let a busy log key expire under its live members; and an
//     admit must set it even when this function set it before, since a
//     decideScript call of a mixed fleet may have shortened it.) A counter
//     admit sets it to the end of the next fixed window plus the margin:
//     that window still reads this one's count.
const decideBatchScript = commonLua + `
local n = #KEYS
local margin = tonumber(ARGV[1])
if n < 1 or n > 1024 or #ARGV > 1 + 7 * n or not margin then
  return redis.error_reply('ERR slidegate: malformed decide batch call')
end
-- The keys' arguments, parsed once: limit, window, flags, hits (and hits
-- as given, for HINCRBY).
local L, W, F, H, HS = {}, {}, {}, {}, {}
local ds, a, k, hits = {}, 2, 0, 0
while a <= #ARGV do
  local nk = tonumber(ARGV[a + 2])
  local cm = ARGV[a + 1]
  if not nk or nk < 1 or nk % 1 ~= 0 or k + nk > n or (cm ~= '0' and cm ~= '1') or a + 2 + 4 * nk > #ARGV then
    return redis.error_reply('ERR slidegate: malformed decide batch call')
  end
  for i = 0, nk - 1 do
    local b = a + 3 + 4 * i
    local l, w, f, h = tonumber(ARGV[b]), tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
    if outOfRange(l, w, f, h) then
      return redis.error_reply('ERR slidegate: decide argument out of range')
    end
    -- A weighted key writes one member whatever its cost.
    if f % 8 >= 4 then hits = hits + 1 else hits = hits + h end
    local j = k + i + 1
    L[j], W[j], F[j], H[j], HS[j] = l, w, f, h, ARGV[b + 3]
  end
  if hits > 65536 then return redis.error_reply('ERR slidegate: decide batch over 65536 hits') end
  ds[#ds + 1] = a
  k, a = k + nk, a + 3 + 4 * nk
end
if k ~= n then return redis.error_reply('ERR slidegate: malformed decide batch call') end
local now = clock()
-- Numbers go to Redis as strings formatted here once: Redis would format
-- each Lua number with %.17g, a measurable part of a call's time.
local function int(v) return string.format('%d', v) end
local nowS = int(now)
-- Per window (most keys of a call share one): the trim's bound, the live
-- range's start and a log key's expiry in ms.
local wins = {}
local function win(w)
  local c = wins[w]
  if not c then
    local cut = int(now - w)
    c = {cut, '(' .. cut, int(math.ceil(w / 1000) + margin)}
    wins[w] = c
  end
  return c
end

-- A key's state in this call, read from Redis when the call first meets
-- it and kept up to date by the call's own admits, so that a hot key's
-- decisions cost one read, one trim and one expiry per call: w, c (the
-- log's live count or the counter's current field), x and p (the
-- counter's field and the previous one's count), admitted.
local st, touched = {}, {}
local function state(key, w, ctr, wt)
  local s = st[key]
  -- A weighted key keeps one state per call (its trim and sums are read
  -- once and written once), whatever windows its rules name.
  if s and (s.w == w or s.wst) then return s end
  s = {w = w, c = 0, x = 0, p = 0, ctr = ctr, admitted = false}
  if wt and not ctr then
    s.wst = wload(key, w, now)
    s.c = s.wst.s
  elseif ctr then
    local x = math.floor(now / w)
    local v = redis.call('HMGET', key, int(x), int(x - 1))
    s.x, s.c, s.p = x, tonumber(v[1]) or 0, tonumber(v[2]) or 0
  else
    s.c = redis.call('ZCOUNT', key, win(w)[2], '+inf')
  end
  st[key] = s
  touched[#touched + 1] = {key, s}
  return s
end

-- count reads one key: allowed, estimate/count, counter field, current
-- and previous fixed-window counts. A SlidingLog key is counted, not
-- trimmed: the trim is the call's last step (see below).
-- A weighted key's need is its cost, or 1 for a check (cost 0: admitted
-- while under the limit); a charge (flag 8) is always admitted.
local function count(key, l, w, f, ctr, h)
  local wt = f % 8 >= 4
  local s = state(key, w, ctr, wt)
  local need = h
  if wt and h < 1 then need = 1 end
  if ctr then
    local x, c, p = s.x, s.c, s.p
    local e = p * (w - (now - x * w)) / w + c
    return f >= 8 or e + need <= l, e, x, c, p
  end
  return f >= 8 or s.c + need <= l, s.c, 0, s.c, 0
end

-- finish writes one key's admit (a counter's; a log's ZADD is done) and
-- appends its five reply values to out.
local function finish(out, key, l, w, ctr, h, hs, ok, commit, e, x, c, p)
  local rem, retry, reset, field = 0, 0, 0, 0
  if ctr then
    local elapsed = now - x * w
    if commit and h > 0 then
      local s = st[key]
      s.c, s.admitted = counterAdd(key, x, int(x), h, hs), true
      c, e, field = c + h, e + h, x
    end
    rem = math.floor(l - e)
    reset = counterReset(w, c, p, elapsed)
    if not ok then retry = counterRetry(l, w, math.max(h, 1), c, p, elapsed) end
  elseif st[key].wst then
    -- A weighted log: its admit is done (wadmit), c is the sum before it.
    local ws = st[key].wst
    if commit then c = c + h end
    rem = l - c
    reset = wreset(ws, now)
    if not ok then retry = wretry(key, ws, math.max(h, 1), l, now) end
  else
    if commit then
      c = c + h
      reset = w
    elseif c > 0 then
      local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
      reset = tonumber(last[2]) + w - now
    end
    if not ok then
      local r = {}
      -- The admit whose leaving makes room for h more: rank c+h-l-1 in
      -- the window (the key is not trimmed yet).
      if l >= h then r = redis.call('ZRANGE', key, win(w)[2], '+inf', 'BYSCORE', 'LIMIT', c + h - l - 1, 1, 'WITHSCORES') end
      if r[2] then retry = tonumber(r[2]) + w - now else retry = w end
    end
    rem = l - c
  end
  reply(out, ok, rem, retry, reset, field)
end

-- Per key of the call (by its index in KEYS), what count found.
local ctrs, oks, es, xs, cs, ps, wts = {}, {}, {}, {}, {}, {}, {}

-- wname is a weighted log key's member for a decision: its cost in its
-- name, so that a resend writes the same member and finds it; a check
-- (cost 0) writes none.
local function wname(member, j)
  if wts[j] and H[j] > 0 then return member .. '|' .. int(H[j]) end
  return nil
end

-- replay answers a decision over keys k0+1..k0+nk already admitted:
-- committed, each key as it now stands (counting the admit), allowed where
-- it was admitted.
local function replay(out, k0, nk, member)
  out[#out + 1] = 1
  for j = k0 + 1, k0 + nk do
    local ok = F[j] % 4 < 2
    if wts[j] then
      local m = wname(member, j)
      ok = ok or (m ~= nil and redis.call('ZSCORE', KEYS[j], m) ~= false)
    elseif not ctrs[j] then ok = ok or redis.call('ZSCORE', KEYS[j], member) ~= false end
    finish(out, KEYS[j], L[j], W[j], ctrs[j], H[j], HS[j], ok, false, es[j], xs[j], cs[j], ps[j])
    if ok and ctrs[j] then out[#out] = xs[j] end
  end
end

-- admitted reports, for a decision that would not admit, whether it
-- already did (a resend of one that did; or its cancel ran first).
local function admitted(k0, nk, member)
  for j = k0 + 1, k0 + nk do
    if wts[j] then
      local m = wname(member, j)
      if m and redis.call('ZSCORE', KEYS[j], m) then return true end
    elseif not ctrs[j] and redis.call('ZSCORE', KEYS[j], member) then return true end
  end
  return false
end

local out = {now}
k = 0
for _, a in ipairs(ds) do
  local member, pass, nk = ARGV[a], ARGV[a + 1] == '1', tonumber(ARGV[a + 2])
  local commit = pass
  for j = k + 1, k + nk do
    ctrs[j] = F[j] % 2 == 1
    wts[j] = F[j] % 8 >= 4 and not ctrs[j]
    oks[j], es[j], xs[j], cs[j], ps[j] = count(KEYS[j], L[j], W[j], F[j], ctrs[j], H[j])
    if not oks[j] and F[j] % 4 < 2 then pass = false end
  end
  local again = commit and not pass and admitted(k, nk, member)
  if pass and not again then
    -- A weighted log's member is looked up before anything is written:
    -- its admit changes sums and checkpoints, which no take-back below
    -- should have to unwind.
    for j = k + 1, k + nk do
      local m = oks[j] and wname(member, j)
      if m and redis.call('ZSCORE', KEYS[j], m) then again = true break end
    end
  end
  if pass then
    -- The count logs' admits first, so that finding the member (a resend)
    -- leaves nothing to take back but these.
    for j = k + 1, k + nk do
      if oks[j] and not ctrs[j] and not wts[j] and not again then
        local key = KEYS[j]
        if redis.call('ZADD', key, 'NX', nowS, member) == 0 then
          again = true
          for i = k + 1, j - 1 do
            if oks[i] and not ctrs[i] and not wts[i] then
              local ms = {member}
              for m = 2, H[i] do ms[m] = member .. '.' .. m end
              local sk = st[KEYS[i]]
              sk.c = sk.c - redis.call('ZREM', KEYS[i], unpack(ms))
            end
          end
        else
          local s = st[key]
          s.c, s.admitted = s.c + 1, true
          if H[j] > 1 then
            local zargs = {}
            for m = 2, H[j] do
              zargs[2 * m - 3], zargs[2 * m - 2] = nowS, member .. '.' .. m
            end
            s.c = s.c + redis.call('ZADD', key, unpack(zargs))
          end
        end
      end
    end
  end
  if pass and not again then
    for j = k + 1, k + nk do
      local m = oks[j] and wname(member, j)
      if m then
        local s = st[KEYS[j]]
        wadmit(KEYS[j], s.wst, m, H[j], now, F[j] >= 8)
        s.c, s.admitted = s.wst.s, true
      end
    end
  end
  if again then
    replay(out, k, nk, member)
  else
    out[#out + 1] = pass and 1 or 0
    for j = k + 1, k + nk do
      finish(out, KEYS[j], L[j], W[j], ctrs[j], H[j], HS[j], oks[j], pass and oks[j], es[j], xs[j], cs[j], ps[j])
    end
  end
  k = k + nk
end
-- Once per key: a log's trim (after the admits, which found any member
-- already there), and the expiry of a key the call admitted into: a log
-- outlives its newest admit by its window and the margin, a counter lasts
-- to the end of the next fixed window (which still reads this one's
-- count) and the margin.
for _, e in ipairs(touched) do
  local key, s = e[1], e[2]
  if s.wst then
    wsave(key, s.wst, margin)
  elseif s.ctr then
    if s.admitted then
      redis.call('PEXPIRE', key, int(math.ceil((2 * s.w - (now - s.x * s.w)) / 1000) + margin))
    end
  else
    local wc = win(s.w)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', wc[1])
    if s.admitted then redis.call('PEXPIRE', key, wc[3]) end
  end
end
return out
`
