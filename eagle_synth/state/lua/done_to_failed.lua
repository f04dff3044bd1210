-- KEYS: done set, failed hash, reasons hash, counters hash, enqueued set. ARGV: reason, then
-- key, stored failure pairs. Moves done keys to failed in one step; keys no longer done are
-- left alone. Writes that need memory come before the SREM, so a full Redis never leaves a key
-- in neither.
local moved = 0
for i = 2, #ARGV, 2 do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 1 then
    if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then
      redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
    end
    redis.call('SADD', KEYS[5], ARGV[i])
    redis.call('SREM', KEYS[1], ARGV[i])
    moved = moved + 1
  end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[4], '$RECORDS', -moved)
  redis.call('HINCRBY', KEYS[4], '$RECORDS_DAMAGED', moved)
  redis.call('HINCRBY', KEYS[4], '$FAILED_PREFIX' .. ARGV[1], moved)
end
return moved
