-- KEYS: failed hash, reasons hash. ARGV: prompt key, stored failure, reason.
-- Keeps the per-reason counts equal to what the failed hash holds.
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then redis.call('HINCRBY', KEYS[2], failure_reason(old), -1) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[2], ARGV[3], 1)
return 1
