-- KEYS: done set, counters hash, enqueued set. ARGV: prompt keys. Returns how many were done.
-- Takes keys whose records were lost back out of `done` into pending, keeping the records
-- counter true. The SADD (which needs memory) comes before the SREM, so a full Redis never
-- leaves a key in neither set.
local removed = 0
for i = 1, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 1 then
    redis.call('SADD', KEYS[3], ARGV[i])
    redis.call('SREM', KEYS[1], ARGV[i])
    removed = removed + 1
  end
end
if removed > 0 then
  redis.call('HINCRBY', KEYS[2], '$RECORDS', -removed)
  redis.call('HINCRBY', KEYS[2], '$RECORDS_DAMAGED', removed)
end
return removed
