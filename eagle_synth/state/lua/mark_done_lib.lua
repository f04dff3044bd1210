-- Shared by every script that marks keys done (mark_done.lua, the conversation store's commit).
-- KEYS[1..5]: done set, failed hash, reasons hash, counters hash, events stream; the enqueued set
-- is the script's LAST key (each script keeps its own layout between). A done key leaves the
-- enqueued set (which holds the keys not done: pending or failed).
local ENQUEUED = KEYS[#KEYS]
local function mark_done(key)
  local added = redis.call('SADD', KEYS[1], key)
  redis.call('SREM', ENQUEUED, key)
  local old = redis.call('HGET', KEYS[2], key)
  if old then
    redis.call('HDEL', KEYS[2], key)
    redis.call('HINCRBY', KEYS[3], failure_reason(old), -1)
  end
  return added
end
local function count_done(added, tokens_in, tokens_out, repaired, maxlen, tokens_cached)
  if added > 0 then
    redis.call('HINCRBY', KEYS[4], '$RECORDS', added)
    redis.call('HINCRBY', KEYS[4], '$TOKENS_IN', tokens_in)
    if tonumber(tokens_cached) > 0 then redis.call('HINCRBY', KEYS[4], '$TOKENS_CACHED', tokens_cached) end
    redis.call('HINCRBY', KEYS[4], '$TOKENS_OUT', tokens_out)
    if tonumber(repaired) > 0 then redis.call('HINCRBY', KEYS[4], '$REPAIRED_PREFIX', repaired) end
    redis.call('XADD', KEYS[5], 'MAXLEN', '~', maxlen, '*',
               'records', added, 'tokens_out', tokens_out, 'tokens_in', tokens_in)
  end
end
