-- renew: extend a lease by ttl in every bucket it holds; a lease already
-- expired (or released) is not brought back.
-- KEYS[i]: the lease zsets of the buckets with a concurrency limit.
-- ARGV: 1 clock offset (µs), 2 lease ttl (µs), 3 lease member.
-- Returns {lost, first}: how many leases were gone, and the index of the first.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local lease = ARGV[3]
local lost, first = 0, 0
for i = 1, #KEYS do
  local s = redis.call('ZSCORE', KEYS[i], lease)
  if s and tonumber(s) > now then
    redis.call('ZADD', KEYS[i], 'XX', now + ttl, lease)
    redis.call('PEXPIRE', KEYS[i], math.ceil(ttl / 1000) + 1000)
  else
    if s then redis.call('ZREM', KEYS[i], lease) end
    lost = lost + 1
    if first == 0 then first = i end
  end
end
return {lost, first}
