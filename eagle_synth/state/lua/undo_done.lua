-- KEYS: done set, counters hash, enqueued set, failed hash, reasons hash. ARGV: a reason ('': back
-- to pending), then prompt keys, or with a reason key, stored failure pairs (to failed). Takes done
-- keys whose records were lost out of `done`, counted as records-damaged; keys no longer done are
-- left alone. Writes that need memory come before the SREM, so a full Redis never leaves a key in
-- neither set. Returns how many moved.
local reason = ARGV[1]
local step = reason == '' and 1 or 2
local moved = 0
for i = 2, #ARGV, step do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 1 then
    if step == 2 and redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 1]) == 1 then
      redis.call('HINCRBY', KEYS[5], reason, 1)
    end
    redis.call('SADD', KEYS[3], ARGV[i])
    redis.call('SREM', KEYS[1], ARGV[i])
    moved = moved + 1
  end
end
if moved > 0 then
  redis.call('HINCRBY', KEYS[2], '$RECORDS', -moved)
  redis.call('HINCRBY', KEYS[2], '$RECORDS_DAMAGED', moved)
  if step == 2 then redis.call('HINCRBY', KEYS[2], '$FAILED_PREFIX' .. reason, moved) end
end
return moved
