-- leave: this gateway's reservations stop counting now (Close).
redis.call('HDEL', KEYS[2], me)
redis.call('ZREM', KEYS[1], me)
keep()
return reply(1)
