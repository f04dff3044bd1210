-- KEYS: failed hash, reasons hash. ARGV: prompt keys. Removes them from `failed`, keeping the
-- per-reason counts true; returns the keys it removed: a key listed twice (HSCAN may return
-- one twice) or dropped meanwhile is taken once, so it is queued once.
local taken = {}
for i = 1, #ARGV do
  local old = redis.call('HGET', KEYS[1], ARGV[i])
  if old then
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('HINCRBY', KEYS[2], failure_reason(old), -1)
    taken[#taken + 1] = ARGV[i]
  end
end
return taken
