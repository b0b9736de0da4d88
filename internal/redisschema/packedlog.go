package redisschema

// The packed log (issue 39's data model, not yet called by the limiter):
// an exact count log of one key in one Redis string, the admit instants
// oldest first, 7 bytes each (µs since ScoreEpoch, big-endian: 2^56 µs
// last two thousand years), strictly increasing (max(now, newest+1)), so
// that the order of the bytes is the order of the admits whatever the
// clock. A key holds no member strings and no skiplist: 7 bytes per live
// admit against about 21 (a listpack) to 100 (a skiplist, past 128
// members) for the sorted set.
//
// A decision reads the string once (GET), finds the first live admit (the
// instants are sorted), and admits iff the live ones leave room for its
// hits; an admit writes its instants into empty slots (SETRANGE), or
// about once a window writes the live admits and its own anew with the
// key's expiry (SET PX), dropping those that left (pdecide); a denial
// writes nothing. The answers
// are exact: remaining is the limit less the live admits, and the retry
// the moment the admit whose leaving makes room leaves. Two commands per
// admit, one per denial, whatever the limit. docs/design/packed-log.md.
//
// Not yet designed here (issue 39): the replay of a decision whose reply
// was lost (the sorted set finds its member; the string has no members),
// the cancel's placeholder, weighted keys and the checkpoints, durable
// admits, and the move of a running fleet from the sorted sets.

// packedLogLua holds the packed log's functions; now is Redis's clock, in
// µs since ScoreEpoch, passed in so that one body serves the decide and
// the tests that drive the clock.
const packedLogLua = `
local pw = 7

-- A packed log key: a header, the moment (µs since ScoreEpoch) the key's
-- expiry as last set runs out; then slots of 7 bytes, the admit instants
-- oldest first, then empty slots (zero) that later admits fill in place.
local function pat(s, i) return (struct.unpack('>I7', s, pw * (i + 1) + 1)) end

-- pcount is the number of admit instants of s and its slots: the first
-- empty slot, found by a plain search for seven zero bytes (in C; a
-- search by halves, five struct.unpack calls at the bench's load, cost
-- 12% more Redis CPU). An instant is never 0, so the first hit at a slot's
-- start is the first empty slot; a hit inside an instant (its low bytes
-- zero, then the next one's high bytes) resumes at the next slot.
local pz = string.rep('\0', pw)
local function pcount(s)
  local c, p = #s / pw - 1, pw + 1
  while true do
    local f = string.find(s, pz, p, true)
    if not f then return c, c end
    local r = (f - 1) % pw
    if r == 0 then return (f - 1) / pw - 1, c end
    p = f + pw - r
  end
end

-- pfirst is the index (0-based) of the first of the n instants of s above
-- cut. At a steady rate an admit finds one or two instants gone from the
-- front: those are stepped over one by one, and only a deeper cut
-- searched by halves.
local function pfirst(s, n, cut)
  local lo = 0
  while lo < n and lo < 3 do
    if pat(s, lo) > cut then return lo end
    lo = lo + 1
  end
  local hi = n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if pat(s, mid) <= cut then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- pdecide decides h hits under limit l over window w (µs) on key at now,
-- and admits them when commit: allowed, remaining, retry and reset in µs,
-- and the instant of the first hit admitted (0 if none). margin is in ms.
--
-- An admit writes its instants into the empty slots (SETRANGE inside the
-- value: nothing of the key is copied, nor its allocation grown) while
-- they hold them, the key lives long enough and the admits that left hold
-- at most a quarter of the instants. Else it writes the key anew (SET
-- PX): the live admits and its own, empty slots for a sixteenth more (at
-- least 8, never past the limit), and an expiry of two windows and the
-- margin past its newest admit, which the header records. So the key is
-- written whole about once a window or every sixteenth of its admits,
-- holds at most a quarter of dead admits and a sixteenth of empty slots
-- beyond its live ones, and outlives its newest admit by a window and the
-- margin.
local function pdecide(key, l, w, h, commit, margin, now)
  local s = redis.call('GET', key)
  local lo, n, c, upto = 0, 0, 0, 0
  if s then
    n, c = pcount(s)
    lo = pfirst(s, n, now - w)
    upto = struct.unpack('>I7', s, 1)
  end
  local live = n - lo
  if live + h > l then
    local retry, reset = w, 0
    if h <= l then retry = pat(s, lo + live + h - l - 1) + w - now end
    if live > 0 then reset = pat(s, n - 1) + w - now end
    return 0, l - live, retry, reset, 0
  end
  local t = now
  if n > 0 then t = math.max(now, pat(s, n - 1) + 1) end
  local last = t + h - 1
  if commit then
    local add = struct.pack('>I7', t)
    if h > 1 then
      local hs = {add}
      for j = 1, h - 1 do hs[j + 1] = struct.pack('>I7', t + j) end
      add = table.concat(hs)
    end
    if n + h <= c and upto >= last + w + 1000 * margin and lo * 4 <= n then
      redis.call('SETRANGE', key, pw * (n + 1), add)
    else
      upto = last + 2 * w + 1000 * margin
      local slack = math.min(l - live - h, math.max(8, math.ceil((live + h) / 16)))
      local v = {struct.pack('>I7', upto), '', add, string.rep('\0', pw * slack)}
      if lo < n then v[2] = string.sub(s, pw * (lo + 1) + 1, pw * (n + 1)) end
      redis.call('SET', key, table.concat(v), 'PX', string.format('%d', math.ceil((upto - now) / 1000)))
    end
  end
  return 1, l - live - h, 0, last + w - now, t
end

-- pundo takes back the h instants from t of key, those still there: an
-- admit whose decision failed on another key. Run twice, the second finds
-- nothing. The expiry and the slots stay as they were.
local function pundo(key, t, h)
  local s = redis.call('GET', key)
  if not s then return 0 end
  local n = pcount(s)
  local i = pfirst(s, n, t - 1)
  local j = i
  while j < n and pat(s, j) <= t + h - 1 do j = j + 1 end
  if j == i then return 0 end
  redis.call('SET', key, string.sub(s, 1, pw * (i + 1)) .. string.sub(s, pw * (j + 1) + 1) .. string.rep('\0', pw * (j - i)), 'KEEPTTL')
  return j - i
end
`

// packedDecideScript decides one key of the packed log (EVAL form).
//
//	KEYS[1]   the key
//	ARGV      limit, window in µs, hits, "1" to admit ("0" to only
//	          decide), expiry margin in ms
//
// Reply: allowed, remaining, retry-after µs, reset-after µs, the instant
// of the first hit admitted (for undo; 0 if none).
const packedDecideScript = commonLua + packedLogLua + `
local l, w, h, m = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
if outOfRange(l, w, 0, h) or not m then return redis.error_reply('ERR slidegate: packed decide argument out of range') end
return {pdecide(KEYS[1], l, w, h, ARGV[4] == '1', m, clock())}
`

// packedUndoScript takes back an admit of the packed log: KEYS[1] the
// key, ARGV the first instant and the hits. Reply: the instants removed.
const packedUndoScript = packedLogLua + `
local t, h = tonumber(ARGV[1]), tonumber(ARGV[2])
if not t or not h or h < 1 or h > 1000 then return redis.error_reply('ERR slidegate: packed undo argument out of range') end
return pundo(KEYS[1], t, h)
`
