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
-- 1 ms to a year (in µs), flags 0-3, 1 to 1000 hits, a limit that is a
-- number.
local function outOfRange(l, w, f, h)
  return not l or not w or w < 1000 or w > 31536000000000 or not f or f < 0 or f > 3 or not h or h < 1 or h > 1000
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
`
