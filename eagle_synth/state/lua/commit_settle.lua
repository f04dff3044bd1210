-- KEYS: a batch lease, its commit receipts (hash holder -> receipt of its last applied commit).
-- ARGV: holder, lease ttl ms, then the receipts of the holder's commit tries whose reply was lost.
-- Whether one of those tries applied: 1 if the holder's last receipt is one of them. Else 0 if the
-- lease is still the holder's: renewed now, which changes the watched key, so a try still on its
-- way (a late EXEC) finds it changed and applies nothing. Else -1: the lease changed (or expired)
-- since, so no try of this holder can apply any more.
local receipt = redis.call('HGET', KEYS[2], ARGV[1])
if receipt then
  for i = 3, #ARGV do
    if receipt == ARGV[i] then return 1 end
  end
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 0
end
return -1
