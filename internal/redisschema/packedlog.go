package redisschema

// The packed log (issue 39's data model, not yet called by the limiter):
// an exact count log of one key in one Redis string, the admit instants
// oldest first (µs since ScoreEpoch, 7 bytes big-endian: 2^56 µs last two
// thousand years), strictly increasing (max(now, newest+1)), so that the
// order of the bytes is the order of the admits whatever the clock. A key
// holds no skiplist and no member per admit: 7 bytes per admit against
// about 21 (a listpack) to 100 (a skiplist, past 128 members) for the
// sorted set, and 15 for the few admitted since the key was last written
// whole, which keep their decision's member beside the instant.
//
// A decision reads the string once (GET), finds the first live admit (the
// instants are sorted), and admits iff the live ones leave room for its
// hits; an admit writes its instants and its member into empty entries
// (SETRANGE), or about once a window writes the live admits and its own
// anew with the key's expiry (SET PX), dropping those that left and the
// members of the others; a denial writes nothing. The answers are exact:
// remaining is the limit less the live admits, and the retry the moment
// the admit whose leaving makes room leaves. Two commands per admit, one
// per denial, whatever the limit. docs/design/packed-log.md.
//
// The members make a decision that runs twice (a ClusterClient resends a
// script whose reply it lost) admit once, and let a cancel take back a
// decision whose reply was lost (pcancel). Not built yet (issue 39; the
// design record works out the first): weighted keys, and the move of a
// running fleet from the sorted sets.

// packedLogLua holds the packed log's functions; now is Redis's clock, in
// µs since ScoreEpoch, passed in so that one body serves the decide and
// the tests that drive the clock.
const packedLogLua = `
-- A packed log key:
--   a header of 14 bytes: the moment (µs since ScoreEpoch) the key's
--   expiry as last set runs out, and k, the number of compacted slots,
--   plus 2^48 while a fresh entry is a cancel's placeholder (pcancel);
--   k compacted slots of 7 bytes: admit instants, oldest first;
--   fresh entries of 15 bytes: an admit instant and its decision's member
--   (8 bytes), those written in place since the key was last written
--   whole, newer than every compacted slot; then empty entries (zero),
--   which later admits fill in place.
local pw, pe, ph, pheld = 7, 15, 14, 281474976710656
local pez = string.rep('\0', pe)

-- pread reads the layout of s: k compacted slots, f fresh entries, fc
-- entries in all, base, the position (1-based) of the first entry, and
-- whether a fresh entry is a placeholder.
-- The first empty entry is found by a plain search for fifteen zero bytes
-- (in C: a search by halves, with a struct.unpack at each step, cost 12%
-- more Redis CPU at the bench's load). An instant is never 0, so a hit at
-- an entry's start is the first empty one; a hit inside an entry (a
-- member's zero bytes, then the next entry) resumes at the next entry.
local function pread(s)
  local k = (struct.unpack('>I7', s, pw + 1))
  local held = k >= pheld
  if held then k = k - pheld end
  local base = ph + pw * k + 1
  local fc = (#s - base + 1) / pe
  local p = base
  while true do
    local z = string.find(s, pez, p, true)
    if not z then return k, fc, fc, base, held end
    local r = (z - base) % pe
    if r == 0 then return k, (z - base) / pe, fc, base, held end
    p = z + pe - r
  end
end

-- pat is the instant of rank i (0-based, compacted slots first).
local function pat(s, k, base, i)
  if i < k then return (struct.unpack('>I7', s, ph + pw * i + 1)) end
  return (struct.unpack('>I7', s, base + pe * (i - k)))
end

-- pfirst is the rank of the first of the n instants of s above cut. At a
-- steady rate an admit finds one or two instants gone from the front:
-- those are stepped over one by one, and only a deeper cut searched by
-- halves.
local function pfirst(s, k, base, n, cut)
  local lo = 0
  while lo < n and lo < 3 do
    if pat(s, k, base, lo) > cut then return lo end
    lo = lo + 1
  end
  local hi = n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if pat(s, k, base, mid) <= cut then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- pfind is the rank of the first fresh entry of member m and the number
-- of entries from it that hold m (a decision of several hits); nil if no
-- fresh entry holds m. A plain search in C, kept to the members' places.
local function pfind(s, k, f, base, m)
  local p, stop = base + pw, base + pe * f
  while true do
    local z = string.find(s, m, p, true)
    if not z or z >= stop then return nil end
    if (z - base - pw) % pe == 0 then
      local j, c = (z - base - pw) / pe, 1
      while j + c < f and string.sub(s, z + pe * c, z + pe * c + 7) == m do c = c + 1 end
      return k + j, c
    end
    p = z + 1
  end
end

-- pwrite admits h hits of member m at instants t.. into s (nil: no key),
-- whose layout is k, f, fc, base, with n instants of which those from
-- rank lo are live. In place (SETRANGE inside the value: nothing of the
-- key is copied, nor its allocation grown) while the empty entries hold
-- them, the key lives long enough and the admits that left hold at most a
-- quarter of the instants. Else it writes the key anew (SET PX): the live
-- instants compacted (their members dropped), its own entries, empty
-- entries for a sixteenth more (at least 8, never past the limit l), and
-- an expiry of two windows and the margin past its newest admit, which
-- the header records. So the key is written whole about once a window or
-- every sixteenth of its admits, holds at most a quarter of dead admits
-- and a sixteenth of empty entries beyond its live ones, and outlives its
-- newest admit by a window and the margin. mark says the admit is a
-- cancel's placeholder, which the header then records.
local function pwrite(key, s, k, f, fc, base, n, lo, upto, t, h, m, l, w, margin, now, mark)
  local last = t + h - 1
  local add = struct.pack('>I7', t) .. m
  if h > 1 then
    local es = {add}
    for j = 1, h - 1 do es[j + 1] = struct.pack('>I7', t + j) .. m end
    add = table.concat(es)
  end
  if f + h <= fc and upto >= last + w + 1000 * margin and lo * 4 <= n then
    redis.call('SETRANGE', key, base - 1 + pe * f, add)
    if mark then redis.call('SETRANGE', key, pw, struct.pack('>I7', k + pheld)) end
    return
  end
  local live = n - lo
  upto = last + 2 * w + 1000 * margin
  local slack = math.max(0, math.min(l - live - h, math.max(8, math.ceil((live + h) / 16))))
  local v = {struct.pack('>I7I7', upto, live + (mark and pheld or 0)), '', '', add, string.rep(pez, slack)}
  if lo < k then v[2] = string.sub(s, ph + pw * lo + 1, ph + pw * k) end
  if n > math.max(lo, k) then
    -- The live fresh entries' instants without their members: one gsub in
    -- C over the range rather than a string.sub per entry (7% of a
    -- decision's Redis CPU in luaab).
    local p = base + pe * (math.max(lo, k) - k)
    v[3] = string.gsub(string.sub(s, p, base + pe * (n - k) - 1), '(.......)........', '%1')
  end
  redis.call('SET', key, table.concat(v), 'PX', string.format('%d', math.ceil((upto - now) / 1000)))
end

-- pjudge judges h hits of member m under limit l over window w (µs) on
-- key at now, writing nothing. It looks for m among the fresh entries
-- when look (a client that may run a script twice: a ClusterClient) or
-- when one of them is a placeholder: else a decision cannot have run
-- before, and the search (10% of a decision's Redis CPU in luaab) is
-- saved. It returns the answer (allowed, remaining,
-- retry and reset in µs, the instant of the first hit), whether it is a
-- replay, and, when it allows a new admit, what pwrite writes it with (s,
-- k, f, fc, base, n, lo, upto): many values rather than a table, which
-- cost every decision an allocation (45% more Redis CPU in luaab). A
-- decision whose member a fresh entry holds was decided before (this call
-- ran twice, or its cancel came first): it is allowed, admits nothing
-- more (a replay) and answers at that entry's instant. Allowed, the
-- answer is the admit's, whether written or not.
local function pjudge(key, l, w, h, now, m, look)
  local s = redis.call('GET', key)
  local k, f, fc, base, lo, n, upto, held = 0, 0, 0, ph + 1, 0, 0, 0, false
  if s then
    k, f, fc, base, held = pread(s)
    n = k + f
    lo = pfirst(s, k, base, n, now - w)
    upto = struct.unpack('>I7', s, 1)
  end
  local live = n - lo
  if f > 0 and (look or held) then
    local i = pfind(s, k, f, base, m)
    if i then
      return 1, l - live, 0, math.max(0, pat(s, k, base, n - 1) + w - now), pat(s, k, base, i), true
    end
  end
  if live + h > l then
    local retry, reset = w, 0
    if h <= l then retry = pat(s, k, base, lo + live + h - l - 1) + w - now end
    if live > 0 then reset = pat(s, k, base, n - 1) + w - now end
    return 0, l - live, retry, reset, 0, false
  end
  local t = now
  if n > 0 then t = math.max(now, pat(s, k, base, n - 1) + 1) end
  return 1, l - live - h, 0, t + h - 1 + w - now, t, false, s, k, f, fc, base, n, lo, upto
end

-- pdecide decides h hits of member m under limit l over window w (µs) on
-- key at now, and admits them when commit (margin in ms): pjudge's
-- answer and whether it is a replay.
local function pdecide(key, l, w, h, commit, margin, now, m, look)
  local ok, rem, retry, reset, t, replay, s, k, f, fc, base, n, lo, upto = pjudge(key, l, w, h, now, m, look)
  if ok == 1 and commit and not replay then pwrite(key, s, k, f, fc, base, n, lo, upto, t, h, m, l, w, margin, now) end
  return ok, rem, retry, reset, t, replay
end

-- prebuild writes s anew without the instants from t to t+h-1, keeping
-- its expiry and its number of entries; it returns how many it dropped.
local function prebuild(key, s, t, h)
  local k, f, fc, base, held = pread(s)
  local cs, fs = {}, {}
  for i = 0, k - 1 do
    local a = pat(s, k, base, i)
    if a < t or a > t + h - 1 then cs[#cs + 1] = string.sub(s, ph + pw * i + 1, ph + pw * (i + 1)) end
  end
  for j = 0, f - 1 do
    local a = pat(s, k, base, k + j)
    if a < t or a > t + h - 1 then fs[#fs + 1] = string.sub(s, base + pe * j, base + pe * (j + 1) - 1) end
  end
  local gone = k + f - #cs - #fs
  if gone == 0 then return 0 end
  local head = string.sub(s, 1, pw) .. struct.pack('>I7', #cs + (held and pheld or 0))
  redis.call('SET', key, head .. table.concat(cs) .. table.concat(fs) .. string.rep(pez, fc - #fs), 'KEEPTTL')
  return gone
end

-- pundo takes back the h instants from t of key, those still there: an
-- admit whose decision failed on another key. Run twice, the second finds
-- nothing. The expiry and the entries stay as they were.
local function pundo(key, t, h)
  local s = redis.call('GET', key)
  if not s then return 0 end
  return prebuild(key, s, t, h)
end

-- pcancel takes back the admit of member m, a decision whose reply was
-- lost: found in a fresh entry, its instants go (the count of them is
-- returned); not found, it either never ran or ran long enough ago that
-- its member was dropped, and pcancel writes a placeholder: one admit of
-- m at max(now, newest+1), whatever the limit. If the decision runs after
-- it, it finds m and admits nothing. The placeholder counts as an admit
-- for a window, so a cancel can only ever make the limit stricter: by the
-- placeholder's one hit, or by the decision's own hits when its member
-- had been dropped (returns 0 then).
local function pcancel(key, m, l, w, margin, now)
  local s = redis.call('GET', key)
  local k, f, fc, base, lo, n, upto = 0, 0, 0, ph + 1, 0, 0, 0
  if s then
    k, f, fc, base = pread(s)
    n = k + f
    local i, c = pfind(s, k, f, base, m)
    if i then return prebuild(key, s, pat(s, k, base, i), c) end
    lo = pfirst(s, k, base, n, now - w)
    upto = struct.unpack('>I7', s, 1)
  end
  local t = now
  if n > 0 then t = math.max(now, pat(s, k, base, n - 1) + 1) end
  pwrite(key, s, k, f, fc, base, n, lo, upto, t, 1, m, l, w, margin, now, true)
  return 0
end
`

// packedDecideScript decides one key of the packed log (EVAL form).
//
//	KEYS[1]   the key
//	ARGV      limit, window in µs, hits, "1" to admit ("0" to only
//	          decide), expiry margin in ms, the decision's member (8
//	          bytes), "1" to look for it whatever the key holds (a
//	          client that may run a script twice)
//
// Reply: allowed, remaining, retry-after µs, reset-after µs, the instant
// of the first hit admitted (for undo; 0 if none).
const packedDecideScript = commonLua + packedLogLua + `
local l, w, h, margin = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
if outOfRange(l, w, 0, h) or not margin or #ARGV[6] ~= 8 then return redis.error_reply('ERR slidegate: packed decide argument out of range') end
local ok, rem, retry, reset, t = pdecide(KEYS[1], l, w, h, ARGV[4] == '1', margin, clock(), ARGV[6], ARGV[7] == '1')
return {ok, rem, retry, reset, t}
`

// packedUndoScript takes back an admit of the packed log: KEYS[1] the
// key, ARGV the first instant and the hits. Reply: the instants removed.
const packedUndoScript = packedLogLua + `
local t, h = tonumber(ARGV[1]), tonumber(ARGV[2])
if not t or not h or h < 1 or h > 1000 then return redis.error_reply('ERR slidegate: packed undo argument out of range') end
return pundo(KEYS[1], t, h)
`

// packedCancelScript takes back the admit of a decision whose reply was
// lost (pcancel): KEYS[1] the key, ARGV the member, limit, window in µs
// and expiry margin in ms. Reply: the instants removed, or 0 when it
// wrote the placeholder.
const packedCancelScript = commonLua + packedLogLua + `
local l, w, margin = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if #ARGV[1] ~= 8 or outOfRange(l, w, 0, 1) or not margin then return redis.error_reply('ERR slidegate: packed cancel argument out of range') end
return pcancel(KEYS[1], ARGV[1], l, w, margin, clock())
`
