package redisschema

// peekBody reads one key the way decideScript's check and finish judge
// it, without admitting, trimming or touching the expiry. The shebang's
// no-writes flag makes Redis itself refuse any write the script might
// attempt, so a read can never change a window (and it may run on a
// read-only replica). The counter's retry is decideScript's
// (commonLua); the rest is written beside it, and the limiter's
// TestPeekAgreesWithNextDecide pins the two together.
//
//	KEYS[1]  the key of the rule and client
//	ARGV[1]  limit, ARGV[2] window in µs, ARGV[3] "1" for a counter key,
//	         "2" for a weighted log key, "3" for a weighted counter key,
//	         "4" for a calendar key (its window: the period's length)
//
// A weighted key's count is the cost in the window, and the request it
// judges is a check (room for 1).
//
// Reply: now (µs since scoreEpoch), allowed, remaining, retry-after µs,
// reset-after µs, count, previous count (counter), elapsed µs in the
// current fixed window (counter), oldest age µs (-1: none), PTTL ms.
const peekBody = commonLua + `
if #KEYS ~= 1 or #ARGV ~= 3 or not tonumber(ARGV[1]) or not tonumber(ARGV[2]) or tonumber(ARGV[2]) < 1 then
  return redis.error_reply('ERR slidegate: malformed peek call')
end
local now = clock()
local key, l, w = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local ctr, wt = ARGV[3] == '1' or ARGV[3] == '3', ARGV[3] == '2'
local pttl = redis.call('PTTL', key)
local ok, rem, retry, reset, c, p, elapsed, oldest = false, 0, 0, 0, 0, 0, 0, -1
if ARGV[3] == '4' then
  -- A calendar key counts only while its period holds now; past it, the
  -- period that does has counted nothing yet (another key).
  local s = qstart(key)
  if not s then return redis.error_reply('ERR slidegate: malformed peek call') end
  if now >= s and now < s + w then
    c = tonumber(redis.call('HGET', key, '0')) or 0
    elapsed = now - s
  end
  ok = c + 1 <= l
  rem = l - c
  if not ok then retry = s + w - now end
  if c > 0 then reset = s + w - now end
elseif ctr then
  local x = math.floor(now / w)
  local v = redis.call('HMGET', key, x, x - 1)
  c, p = tonumber(v[1]) or 0, tonumber(v[2]) or 0
  elapsed = now - x * w
  local e = p * (w - elapsed) / w + c
  ok = e + 1 <= l
  rem = math.floor(l - e)
  reset = counterReset(w, c, p, elapsed)
  if not ok then retry = counterRetry(l, w, 1, c, p, elapsed) end
elseif wt then
  -- wload only reads: what left the window is skipped, not removed.
  local ws = wload(key, w, now)
  c = ws.s
  ok = c + 1 <= l
  local first = redis.call('ZRANGE', key, '(' .. wint(now - w), '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  if first[2] then oldest = now - tonumber(first[2]) end
  reset = wreset(ws, now)
  if not ok then retry = wretry(key, ws, 1, l, now) end
  rem = l - c
else
  -- decideScript trims scores <= now-w; here they are only skipped.
  local stale = redis.call('ZCOUNT', key, '-inf', now - w)
  c = redis.call('ZCARD', key) - stale
  ok = c < l
  if c > 0 then
    local first = redis.call('ZRANGE', key, stale, stale, 'WITHSCORES')
    oldest = now - tonumber(first[2])
  end
  reset = logReset(key, c, w, now)
  if not ok then retry = logRetry(key, '(' .. wint(now - w), c, 1, l, w, now) end
  rem = l - c
end
if rem < 0 then rem = 0 end
return {now, ok and 1 or 0, rem, retry, reset, c, p, elapsed, oldest, pttl}
`

// noWritesShebang gives the EVAL form of a no-writes function (Peek) its
// flag; the library registers the body with the same flag.
const noWritesShebang = "#!lua flags=no-writes\n"
