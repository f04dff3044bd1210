-- KEYS: done set, enqueued set. ARGV: prompt keys read from `done`. Takes the done ones out of
-- `enqueued`: the one-time move of a campaign made before done keys left it (Campaign.progress).
local moved = 0
for i = 1, #ARGV do
  if redis.call('SISMEMBER', KEYS[1], ARGV[i]) == 1 then moved = moved + redis.call('SREM', KEYS[2], ARGV[i]) end
end
return moved
