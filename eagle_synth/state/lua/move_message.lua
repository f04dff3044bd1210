-- Move one queued message to another priority list of its queue, unless a worker took it meanwhile.
-- KEYS[1]: the list it is in; KEYS[2]: the list it goes to.
-- ARGV[1]: the message as it is; ARGV[2]: the message with its new priority.
-- Returns 1 when moved, 0 when it was no longer there.
if redis.call("LREM", KEYS[1], 1, ARGV[1]) == 1 then
  redis.call("LPUSH", KEYS[2], ARGV[2])
  return 1
end
return 0
