-- KEYS: owners. ARGV: new owner, dead owner, then fields. Returns the fields taken over
-- (compare-and-set on each field's owner).
local taken = {}
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[2] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[1])
    taken[#taken + 1] = ARGV[i]
  end
end
return taken
