-- Hand a message waiting in a host queue's list to the matching list of its campaign's queue,
-- at the end taken next (kombu pushes left and pops right), unless a worker took it meanwhile.
-- KEYS[1]: the host queue's list; KEYS[2]: the campaign queue's list.
-- ARGV[1]: the message as it is; ARGV[2]: the message addressed to the campaign queue.
-- Returns 1 when moved, 0 when it was no longer there.
if redis.call("LREM", KEYS[1], 1, ARGV[1]) == 1 then
  redis.call("RPUSH", KEYS[2], ARGV[2])
  return 1
end
return 0
