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
local n, na = #KEYS, #ARGV
local margin = tonumber(ARGV[1])
local function malformed() return redis.error_reply('ERR slidegate: malformed decide batch call') end
if n < 1 or n > 1024 or na > 1 + 7 * n or not margin then return malformed() end

-- A large part of Lua's time in a call like this one went to tables that
-- grow (each doubling is an allocation and a copy): a table per key and
-- an array per field growing with the call's keys cost about 2 us per
-- decision, a third of the four commands' own cost. So the keys'
-- arguments are read from ARGV as each decision needs them into small
-- arrays that every decision reuses, and the keys' states live in one
-- flat array.

-- rule reads the arguments of a key (at ARGV[b]): limit, window, flags,
-- hits, hits as given (for HINCRBY), whether a counter, whether weighted;
-- nil if out of range. The keys of a call mostly repeat one rule's
-- arguments, the same strings, which are converted and checked once.
local ql, qw, qf, qh, Ql, Qw, Qf, Qh, Qc, Qt
local function rule(b)
  local sl, sw, sf, sh = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  if sl ~= ql or sw ~= qw or sf ~= qf or sh ~= qh then
    Ql, Qw, Qf, Qh = tonumber(sl), tonumber(sw), tonumber(sf), tonumber(sh)
    if outOfRange(Ql, Qw, Qf, Qh) then
      ql = nil
      return nil
    end
    ql, qw, qf, qh = sl, sw, sf, sh
    Qc = Qf % 2 == 1
    Qt = Qf % 8 >= 4 and not Qc
  end
  return Ql, Qw, Qf, Qh, sh, Qc, Qt
end

-- keys reads a decision's number of keys (at ARGV[a+2]).
local function keys(a)
  local s = ARGV[a + 2]
  if s == '1' then return 1 end
  return tonumber(s)
end

-- Every argument is checked before anything runs: at most 1024 keys and
-- 65536 hits in all.
local a, k, hits = 2, 0, 0
while a <= na do
  local nk, cm = keys(a), ARGV[a + 1]
  if not nk or nk < 1 or nk % 1 ~= 0 or k + nk > n or (cm ~= '0' and cm ~= '1') or a + 2 + 4 * nk > na then
    return malformed()
  end
  for b = a + 3, a + 4 * nk - 1, 4 do
    local l, w, f, h = rule(b)
    if not l then return redis.error_reply('ERR slidegate: decide argument out of range') end
    -- A weighted key writes one member whatever its cost.
    if f % 8 >= 4 then hits = hits + 1 else hits = hits + h end
  end
  if hits > 65536 then return redis.error_reply('ERR slidegate: decide batch over 65536 hits') end
  k, a = k + nk, a + 3 + 4 * nk
end
if k ~= n then return malformed() end

local now = clock()
-- Numbers go to Redis as strings formatted here once: Redis would format
-- each Lua number with %.17g, a measurable part of a call's time.
local function int(v) return string.format('%d', v) end
local nowS = int(now)
-- Per window (most keys of a call share one), what every key of it
-- needs, formatted once: the trim's bound, the live range's start, a log
-- key's expiry in ms; a counter's field, the field and the previous one
-- as strings, and its expiry in ms (the end of the next fixed window,
-- which still reads this one's count, and the margin).
local wins = {}
local function win(w)
  local c = wins[w]
  if not c then
    local cut, x = int(now - w), math.floor(now / w)
    c = {cut, '(' .. cut, int(math.ceil(w / 1000) + margin), x, int(x), int(x - 1),
      int(math.ceil((2 * w - (now - x * w)) / 1000) + margin)}
    wins[w] = c
  end
  return c
end

-- A key's state in this call, read from Redis when the call first meets
-- it and kept up to date by the call's own admits, so that a hot key's
-- decisions cost one read, one trim and one expiry per call. A state is
-- an offset s in S: S[s] the key, S[s+1] its window, S[s+2] the log's
-- live count or the counter's current field's count, S[s+3] and S[s+4]
-- the counter's field and previous field's count, S[s+5] whether a
-- counter, S[s+6] whether the call admitted into it, S[s+7] whether a
-- counter's field was empty when the call met it, S[s+8] a weighted
-- log's state (or false).
local S, at = {}, {}
local function state(key, w, ctr, wt)
  local s = at[key]
  -- A weighted key keeps one state per call (its trim and sums are read
  -- once and written once), whatever windows its rules name.
  if s and (S[s + 1] == w or S[s + 8]) then return s end
  s = #S + 1
  local c, x, p, ws = 0, 0, 0, false
  if wt then
    ws = wload(key, w, now)
    c = ws.s
  elseif ctr then
    local cw = win(w)
    local v = redis.call('HMGET', key, cw[5], cw[6])
    x, c, p = cw[4], tonumber(v[1]) or 0, tonumber(v[2]) or 0
  else
    c = redis.call('ZCOUNT', key, win(w)[2], '+inf')
  end
  S[s], S[s + 1], S[s + 2], S[s + 3], S[s + 4], S[s + 5], S[s + 6], S[s + 7], S[s + 8] =
    key, w, c, x, p, ctr, false, ctr and c == 0, ws
  at[key] = s
  return s
end

-- A decision's keys, by their place i in it (key k+i of the call): the
-- key, its rule (L W F H HS CT WT), its state (SI) and what count found
-- (OK E X C P). Every decision reuses these arrays.
local K, L, W, F, H, HS, CT, WT, SI, OK, E, X, C, P = {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}

-- count reads key i: allowed, estimate/count, counter field, current and
-- previous fixed-window counts. A SlidingLog key is counted, not trimmed:
-- the trim is the call's last step (see below). A weighted key's need is
-- its cost, or 1 for a check (cost 0: admitted while under the limit); a
-- charge (flag 8) is always admitted.
local function count(i)
  local s, l, need = SI[i], L[i], H[i]
  if F[i] % 8 >= 4 and need < 1 then need = 1 end
  if CT[i] then
    local w, x, c, p = W[i], S[s + 3], S[s + 2], S[s + 4]
    local e = p * (w - (now - x * w)) / w + c
    return F[i] >= 8 or e + need <= l, e, x, c, p
  end
  local c = S[s + 2]
  return F[i] >= 8 or c + need <= l, c, 0, c, 0
end

-- finish writes key i's admit (a counter's; a log's ZADD is done) and
-- appends its five reply values to out.
local function finish(out, i, ok, commit)
  local key, l, w, h, s = K[i], L[i], W[i], H[i], SI[i]
  local e, x, c, p = E[i], X[i], C[i], P[i]
  local rem, retry, reset, field = 0, 0, 0, 0
  if CT[i] then
    local elapsed = now - x * w
    if commit and h > 0 then
      S[s + 2], S[s + 6] = counterAdd(key, x, win(w)[5], h, HS[i]), true
      c, e, field = c + h, e + h, x
    end
    rem = math.floor(l - e)
    reset = counterReset(w, c, p, elapsed)
    if not ok then retry = counterRetry(l, w, math.max(h, 1), c, p, elapsed) end
  elseif WT[i] then
    -- A weighted log: its admit is done (wadmit), c is the sum before it.
    local ws = S[s + 8]
    if commit then c = c + h end
    rem = l - c
    reset = wreset(ws, now)
    if not ok then retry = wretry(key, ws, math.max(h, 1), l, now) end
  else
    if commit then
      c = c + h
      reset = w
    else
      reset = logReset(key, c, w, now)
    end
    -- The key is not trimmed yet: logRetry reads the window by score.
    if not ok then retry = logRetry(key, win(w)[2], c, h, l, w, now) end
    rem = l - c
  end
  reply(out, ok, rem, retry, reset, field)
end

-- wname is a weighted log key's member for a decision: its cost in its
-- name, so that a resend writes the same member and finds it; a check
-- (cost 0) writes none.
local function wname(member, i)
  if WT[i] and H[i] > 0 then return member .. '|' .. int(H[i]) end
  return nil
end

-- found reports whether key i holds the decision's member.
local function found(member, i)
  if WT[i] then
    local m = wname(member, i)
    return m ~= nil and redis.call('ZSCORE', K[i], m) ~= false
  end
  return not CT[i] and redis.call('ZSCORE', K[i], member) ~= false
end

-- replay answers a decision of nk keys already admitted: committed, each
-- key as it now stands (counting the admit), allowed where it was
-- admitted.
local function replay(out, nk, member)
  out[#out + 1] = 1
  for i = 1, nk do
    local ok = F[i] % 4 < 2 or found(member, i)
    finish(out, i, ok, false)
    if ok and CT[i] then out[#out] = X[i] end
  end
end

-- admitted reports, for a decision that would not admit, whether it
-- already did (a resend of one that did; or its cancel ran first).
local function admitted(nk, member)
  for i = 1, nk do
    if found(member, i) then return true end
  end
  return false
end

-- log reports whether key i is a count log's (not a counter's, not
-- weighted).
local function log(i) return not CT[i] and not WT[i] end

-- decide decides the decision at ARGV[a] (of nk keys, from key k+1 on),
-- whatever it is, and appends its reply to out.
local function decide(out, a, k, member, pass, nk)
  local commit, weighted = pass, false
  for i = 1, nk do
    local key = KEYS[k + i]
    local l, w, f, h, hs, ct, wt = rule(a - 1 + 4 * i)
    K[i], L[i], W[i], F[i], H[i], HS[i], CT[i], WT[i] = key, l, w, f, h, hs, ct, wt
    SI[i] = state(key, w, ct, wt)
    OK[i], E[i], X[i], C[i], P[i] = count(i)
    if not OK[i] and f % 4 < 2 then pass = false end
    if wt then weighted = true end
  end
  local again = commit and not pass and admitted(nk, member)
  if pass and not again and weighted then
    -- A weighted log's member is looked up before anything is written:
    -- its admit changes sums and checkpoints, which no take-back below
    -- should have to unwind.
    for i = 1, nk do
      if OK[i] and WT[i] and H[i] > 0 and found(member, i) then again = true break end
    end
  end
  if pass then
    -- The count logs' admits first, so that finding the member (a resend)
    -- leaves nothing to take back but these.
    for i = 1, nk do
      if OK[i] and log(i) and not again then
        local key, s = K[i], SI[i]
        if redis.call('ZADD', key, 'NX', nowS, member) == 0 then
          again = true
          for t = 1, i - 1 do
            if OK[t] and log(t) then
              local ms = {member}
              for m = 2, H[t] do ms[m] = member .. '.' .. m end
              local st = SI[t]
              S[st + 2] = S[st + 2] - redis.call('ZREM', K[t], unpack(ms))
            end
          end
        else
          S[s + 2], S[s + 6] = S[s + 2] + 1, true
          if H[i] > 1 then
            local zargs = {}
            for m = 2, H[i] do
              zargs[2 * m - 3], zargs[2 * m - 2] = nowS, member .. '.' .. m
            end
            S[s + 2] = S[s + 2] + redis.call('ZADD', key, unpack(zargs))
          end
        end
      end
    end
  end
  if pass and not again and weighted then
    for i = 1, nk do
      local m = OK[i] and wname(member, i)
      if m then
        local s = SI[i]
        wadmit(K[i], S[s + 8], m, H[i], now, F[i] >= 8)
        S[s + 2], S[s + 6] = S[s + 8].s, true
      end
    end
  end
  if again then
    replay(out, nk, member)
  else
    out[#out + 1] = pass and 1 or 0
    for i = 1, nk do finish(out, i, OK[i], pass and OK[i]) end
  end
end

-- admitPlain admits the most common decisions, one hit on one count key
-- under its limit (a log's: not admitted before), with less Lua than
-- decide, and appends its reply; decide gives the same for them
-- (TestBatchShortPathAnswersAsDecide). Measured with test/bench/luaab:
-- 0.88x the Redis CPU per log decision, 0.73-0.87x per counter decision.
-- For any other decision it reports false, having written nothing.
local function admitPlain(out, key, b, member)
  local l, w, _, h, hs, ct, wt = rule(b)
  if wt or h ~= 1 then return false end
  local s = state(key, w, ct, false)
  local c, o = S[s + 2], #out
  if ct then
    local x = S[s + 3]
    local e = S[s + 4] * (w - (now - x * w)) / w + c
    if e + 1 > l then return false end
    S[s + 2], S[s + 6] = counterAdd(key, x, win(w)[5], 1, hs), true
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 1, 1, math.floor(l - e - 1), 0, w, x
    return true
  end
  if c + 1 > l or redis.call('ZADD', key, 'NX', nowS, member) == 0 then return false end
  S[s + 2], S[s + 6] = c + 1, true
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] = 1, 1, l - c - 1, 0, w, 0
  return true
end

local out = {now}
a, k = 2, 0
while a <= na do
  local member, pass, nk = ARGV[a], ARGV[a + 1] == '1', keys(a)
  if not (pass and nk == 1 and admitPlain(out, KEYS[k + 1], a + 3, member)) then
    decide(out, a, k, member, pass, nk)
  end
  k, a = k + nk, a + 3 + 4 * nk
end
-- Once per key: a log's trim (after the admits, which found any member
-- already there), and the expiry of a key the call admitted into: a log
-- outlives its newest admit by its window and the margin; a counter lasts
-- to the end of the next fixed window and the margin, the same instant
-- for every admit into one field, so only the call that first admits into
-- a field sets it (every admit into a field since library revision 3 set
-- it, so a field with a count has it).
for s = 1, #S, 9 do
  local key, w = S[s], S[s + 1]
  if S[s + 8] then
    wsave(key, S[s + 8], margin)
  elseif S[s + 5] then
    if S[s + 6] and S[s + 7] then redis.call('PEXPIRE', key, win(w)[7]) end
  else
    local wc = win(w)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', wc[1])
    if S[s + 6] then redis.call('PEXPIRE', key, wc[3]) end
  end
end
return out
`
