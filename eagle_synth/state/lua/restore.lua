-- KEYS: unacked hash, unacked index, batch lease, destination list.
-- ARGV: delivery tag, the entry as read, the message to push back.
-- The push comes first: a Redis that refuses it (full) then changes nothing.
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('RPUSH', KEYS[4], ARGV[3])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
