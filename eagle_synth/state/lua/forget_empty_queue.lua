-- Drop a host queue from the registry when every list of it is empty. Publishers list a queue
-- after pushing to it, so one that holds a message is never dropped.
-- KEYS[1]: the registry hash; KEYS[2..]: the queue's lists. ARGV[1]: the queue's name.
-- Returns 1 when dropped.
for i = 2, #KEYS do
  if redis.call("LLEN", KEYS[i]) > 0 then
    return 0
  end
end
return redis.call("HDEL", KEYS[1], ARGV[1])
