-- KEYS: enqueued, done, failed, ended, outbox, events, conversation ends, followups, followup
-- batches, stored batches, key claims. ARGV: expected enqueued, done, failed counts, the marker
-- JSON. Frees the folded sets only if nothing changed since they were read (an enqueue or retry
-- that ran meanwhile aborts it). The stored batches and claims go too: every key of a complete
-- campaign has ended, so no stored batch has anything left that the reconciler could publish.
if redis.call('SCARD', KEYS[1]) ~= tonumber(ARGV[1]) or redis.call('SCARD', KEYS[2]) ~= tonumber(ARGV[2])
   or redis.call('HLEN', KEYS[3]) ~= tonumber(ARGV[3]) or redis.call('HLEN', KEYS[5]) ~= 0
   or redis.call('HLEN', KEYS[8]) ~= 0 or redis.call('HLEN', KEYS[9]) ~= 0 then
  return 0
end
redis.call('SET', KEYS[4], ARGV[4])
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[6], KEYS[7], KEYS[10], KEYS[11])
return 1
