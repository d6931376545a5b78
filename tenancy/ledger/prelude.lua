-- prelude: the part every ledger script shares (prepended to try_add.lua,
-- sync.lua and leave.lua, which end it with their own return).
-- KEYS[1]: leases, a sorted set: gateway id -> lease expiry (µs, TIME).
-- KEYS[2]: vectors, a hash: gateway id -> "nonce,seq,b0,b1,..." (that
--          gateway's blocks reserved per replica index).
-- KEYS[3]: the epoch: when this state began (µs).
-- ARGV: 1 lease ttl (µs), 2 gateway id, 3 nonce, 4 seq, 5 recovery window (µs),
--       6 replica (0-based), 7 weight, 8 limit, 9 n, then n blocks: this
--       gateway's vector (for try_add, without the weight).
-- Every script returns {code, recovering, others_1, ..., others_m}: code
-- 1 written (try_add: admitted), 0 try_add refused (the vector written
-- without the weight), -1 stale (a newer write of this instance is stored:
-- nothing written); recovering 1 within the recovery window of a fresh
-- epoch (Redis was empty: every live gateway writes its vector back within
-- the window, and try_add admits nothing until then); others_j
-- the sum over the other live gateways on replica j-1.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local ttl = tonumber(ARGV[1])
local me, nonce, seq = ARGV[2], ARGV[3], tonumber(ARGV[4])
local n = tonumber(ARGV[9])

-- Expired leases: their gateways stop counting and their vectors go.
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for i = 1, #dead do redis.call('HDEL', KEYS[2], dead[i]) end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end

-- The epoch: absent on a fresh (or restarted, or expired) state.
local since = tonumber(redis.call('GET', KEYS[3]))
if not since then
  since = now
  redis.call('SET', KEYS[3], string.format('%.0f', now))
end
local recovering = now < since + tonumber(ARGV[5])

-- The other live gateways' sums per replica; this gateway's stored record.
local others, m, mine = {}, 0, nil
local all = redis.call('HGETALL', KEYS[2])
for i = 1, #all, 2 do
  local g, rec = all[i], all[i + 1]
  if g == me then
    mine = rec
  elseif redis.call('ZSCORE', KEYS[1], g) then
    local j = -1
    for tok in string.gmatch(rec, '[^,]+') do
      if j >= 1 then
        others[j] = (others[j] or 0) + tonumber(tok)
        if j > m then m = j end
      end
      j = j + 1
    end
  else
    redis.call('HDEL', KEYS[2], g) -- a vector without a lease
  end
end
for j = 1, m do others[j] = others[j] or 0 end

local stale = false
if mine then
  local a, b = string.match(mine, '^([^,]*),([^,]*)')
  stale = a == nonce and tonumber(b) ~= nil and tonumber(b) >= seq
end

local vec = {}
for j = 1, n do vec[j] = tonumber(ARGV[9 + j]) end

local function keep()
  local ms = math.ceil(ttl / 1000) + 1000
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ms) end
end

local function write()
  local parts = {nonce, ARGV[4]}
  for j = 1, n do parts[j + 2] = string.format('%d', vec[j]) end
  redis.call('HSET', KEYS[2], me, table.concat(parts, ','))
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), me)
  keep()
end

local function reply(code)
  local out = {code, recovering and 1 or 0}
  for j = 1, m do out[j + 2] = others[j] end
  return out
end
