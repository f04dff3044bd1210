-- KEYS: enqueued set, outbox hash, counters hash, done set. ARGV: outbox field, chunk blob,
-- counter name ('' for none), then prompt keys. A key is new if it is neither enqueued nor done.
-- Returns the 0-based indices of keys that were new; records them with the chunk, and adds
-- their number to the counter (e.g. conversations started: counted in the same step as the
-- claim, so a killed run counts each exactly once).
local new = {}
for i = 4, #ARGV do
  if redis.call('SISMEMBER', KEYS[4], ARGV[i]) == 0 and redis.call('SADD', KEYS[1], ARGV[i]) == 1 then
    new[#new + 1] = i - 4
  end
end
if #new > 0 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('HSET', KEYS[2], ARGV[1] .. ':new', cjson.encode(new))
  if ARGV[3] ~= '' then redis.call('HINCRBY', KEYS[3], ARGV[3], #new) end
end
return new
