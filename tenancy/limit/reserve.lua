-- reserve: check every bucket, then charge all of them or none.
-- KEYS[2i-1]: bucket i's levels (hash r, t, ts); KEYS[2i]: its leases (zset, score = expiry).
-- ARGV: 1 clock offset (µs, 0 outside tests), 2 window (µs), 3 lease ttl (µs),
--       4 lease member, 5 cost (tokens), 6 n, then per bucket i: rpm, tpm, max_concurrency.
-- Returns {code, bucket, retry µs, now µs, remaining requests, reset requests µs,
--          remaining tokens, reset tokens µs}; code 0 admitted, 1 rpm, 2 tpm,
--          3 concurrency; the last four describe bucket 1 after the decision.
-- The formulas are bucket.go's, operation for operation.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local lease = ARGV[4]
local cost = tonumber(ARGV[5])
local n = tonumber(ARGV[6])
local concretry = 1000000

local function drain(level, el, limit)
  if el <= 0 or level <= 0 then return math.max(level, 0) end
  level = level - el * limit / window
  if level < 0 then return 0 end
  return level
end
-- later: bucket.go's; lts[i] is nil for a new bucket.
local function later(last, t) if last and last > t then return last end return t end
local function fits(level, c, limit) return level + c <= limit + limit * 1e-9 end
local function wait(level, c, limit) return math.ceil((level + c - limit) * window / limit) end

local lr, lt, lts = {}, {}, {}
local code, who, worst = 0, 0, 0
local function refuse(c, i, w)
  if who == 0 or w > worst then code, who, worst = c, i, w end
end
for i = 1, n do
  local rpm, tpm, conc = tonumber(ARGV[3*i+4]), tonumber(ARGV[3*i+5]), tonumber(ARGV[3*i+6])
  local r, tk = 0, 0
  if rpm > 0 or tpm > 0 then
    local h = redis.call('HMGET', KEYS[2*i-1], 'r', 't', 'ts')
    if h[3] then
      local el = now - tonumber(h[3])
      if rpm > 0 then r = drain(tonumber(h[1]) or 0, el, rpm) end
      if tpm > 0 then tk = drain(tonumber(h[2]) or 0, el, tpm) end
      lts[i] = tonumber(h[3])
    end
  end
  lr[i], lt[i] = r, tk
  if rpm > 0 and not fits(r, 1, rpm) then refuse(1, i, wait(r, 1, rpm)) end
  if tpm > 0 and not fits(tk, cost, tpm) then refuse(2, i, wait(tk, cost, tpm)) end
  if conc > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[2*i], '-inf', now)
    if redis.call('ZCARD', KEYS[2*i]) + 1 > conc then refuse(3, i, concretry) end
  end
end

if code == 0 then
  for i = 1, n do
    local rpm, tpm, conc = tonumber(ARGV[3*i+4]), tonumber(ARGV[3*i+5]), tonumber(ARGV[3*i+6])
    if rpm > 0 or tpm > 0 then
      local life = 0
      if rpm > 0 then
        lr[i] = lr[i] + 1
        life = lr[i] * window / rpm
      end
      if tpm > 0 then
        lt[i] = lt[i] + cost
        life = math.max(life, lt[i] * window / tpm)
      end
      redis.call('HSET', KEYS[2*i-1], 'r', lr[i], 't', lt[i], 'ts', later(lts[i], now))
      redis.call('PEXPIRE', KEYS[2*i-1], math.ceil(math.min(life, 31622400000000) / 1000) + 1000)
    end
    if conc > 0 then
      redis.call('ZADD', KEYS[2*i], now + ttl, lease)
      redis.call('PEXPIRE', KEYS[2*i], math.ceil(ttl / 1000) + 1000)
    end
  end
end

local function rem(level, limit)
  if limit <= 0 then return 0 end
  local x = math.floor(limit - level + limit * 1e-9)
  if x < 0 then return 0 end
  if x > limit then return limit end
  return x
end
local function reset(level, limit)
  if limit <= 0 or level <= 0 then return 0 end
  return math.ceil(level * window / limit)
end
local rpm1, tpm1 = tonumber(ARGV[7]), tonumber(ARGV[8])
return {code, who, worst, now, rem(lr[1], rpm1), reset(lr[1], rpm1), rem(lt[1], tpm1), reset(lt[1], tpm1)}
