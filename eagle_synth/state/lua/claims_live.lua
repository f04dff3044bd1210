-- KEYS: claims hash. ARGV: keys. Returns the keys whose claim's lease is live.
local live = {}
for i = 1, #ARGV do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  if current and claim_live(current) then table.insert(live, ARGV[i]) end
end
return live
