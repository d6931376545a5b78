-- try_add: reserve ARGV[7] blocks on replica ARGV[6] if its total over
-- every live gateway is 0 before or at most ARGV[8] after, unless the
-- state is recovering (then nothing is admitted: gateways that held
-- reservations before Redis lost them may not have written them back
-- yet). The vector is written either way.
if stale then return reply(-1) end
local r = tonumber(ARGV[6]) + 1
local w, limit = tonumber(ARGV[7]), tonumber(ARGV[8])
for j = n + 1, r do vec[j] = 0 end
if r > n then n = r end
local before = (others[r] or 0) + vec[r]
local ok = not recovering and (before == 0 or before + w <= limit)
if ok then vec[r] = vec[r] + w end
write()
if ok then return reply(1) end
return reply(0)
