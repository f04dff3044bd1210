-- KEYS: claims hash, own lease. ARGV: own holder, then prompt keys.
-- Returns -1 if the own lease is gone, else the keys claimed by another live batch (skipped).
local own = KEYS[2] .. '\n' .. ARGV[1]
if redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local busy = {}
for i = 2, #ARGV do
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  if current and current ~= own and claim_live(current) then
    table.insert(busy, ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], own)
  end
end
return busy
