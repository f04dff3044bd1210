-- KEYS: claims hash. ARGV: claim value, then keys. Releases the keys still claimed with that value.
local released = 0
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    released = released + 1
  end
end
return released
