-- KEYS: lease. ARGV: holder, ttl ms. Renews the lease if it is still the holder's.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
