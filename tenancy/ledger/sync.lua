-- sync: write this gateway's vector as it is and renew its lease (Add, the
-- heartbeat, a refresh).
if stale then return reply(-1) end
write()
return reply(1)
