-- KEYS: lease. ARGV: the dead holder, the new holder, ttl ms. Gives the lease to the new holder
-- if the dead one still holds it; returns 1 when taken over, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) return 1 end
return 0
