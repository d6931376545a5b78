-- finish: release the lease in every bucket and reconcile TPM by delta
-- tokens (used - charged: negative refunds, positive charges, possibly into
-- debt; never refused).
-- KEYS[2i-1]: bucket i's levels; KEYS[2i]: its leases.
-- ARGV: 1 clock offset (µs), 2 window (µs), 3 lease member, 4 delta, 5 n,
--       then per bucket i: rpm, tpm, max_concurrency.
-- Returns the number of leases that were still held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local lease = ARGV[3]
local delta = tonumber(ARGV[4])
local n = tonumber(ARGV[5])

-- later: bucket.go's (a bucket's time never moves back).
local function later(last, t) if last and last > t then return last end return t end
local function drain(level, el, limit)
  if el <= 0 or level <= 0 then return math.max(level, 0) end
  level = level - el * limit / window
  if level < 0 then return 0 end
  return level
end

local held = 0
for i = 1, n do
  local rpm, tpm, conc = tonumber(ARGV[3*i+3]), tonumber(ARGV[3*i+4]), tonumber(ARGV[3*i+5])
  if conc > 0 then
    held = held + redis.call('ZREM', KEYS[2*i], lease)
  end
  if tpm > 0 and delta ~= 0 then
    local h = redis.call('HMGET', KEYS[2*i-1], 'r', 't', 'ts')
    local r, tk, ts = 0, 0, now
    if h[3] then
      ts = later(tonumber(h[3]), now)
      local el = now - tonumber(h[3])
      if rpm > 0 then r = drain(tonumber(h[1]) or 0, el, rpm) end
      tk = drain(tonumber(h[2]) or 0, el, tpm)
    end
    tk = math.max(0, tk + delta)
    local life = tk * window / tpm
    if rpm > 0 then life = math.max(life, r * window / rpm) end
    redis.call('HSET', KEYS[2*i-1], 'r', r, 't', tk, 'ts', ts)
    redis.call('PEXPIRE', KEYS[2*i-1], math.ceil(math.min(life, 31622400000000) / 1000) + 1000)
  end
end
return held
