-- KEYS: followups, owners, batches. ARGV: owner, batch id, payload, then turn keys. Returns the
-- keys this owner does not hold (then nothing changed), or {} when the batch entry was formed.
local lost = {}
for i = 4, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
    lost[#lost + 1] = ARGV[i]
  end
end
if #lost > 0 then return lost end
for i = 4, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[2], 'batch:' .. ARGV[2], ARGV[1])
return lost
