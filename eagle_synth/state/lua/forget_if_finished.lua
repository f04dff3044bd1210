-- KEYS: batches hash, done set, failed hash. ARGV: batch id, then its keys.
-- Deletes the entry when every key is done or failed; returns 1 if it did.
for i = 2, #ARGV do
  if redis.call('SISMEMBER', KEYS[2], ARGV[i]) == 0 and redis.call('HEXISTS', KEYS[3], ARGV[i]) == 0 then
    return 0
  end
end
return redis.call('HDEL', KEYS[1], ARGV[1])
