-- KEYS: done, failed, failed reasons, counters, events, followups, owners, ends, enqueued. ARGV: tokens_in,
-- tokens_out, repaired, events maxlen, owner, tokens_cached, then per record: key, action (follow | end | ''),
-- target (next turn key | conversation key), data. Returns {number newly done, the next turn
-- keys stored...}: a follow-up is stored only for a key newly marked done, so exactly once.
local added = 0
local stored = {}
for i = 7, #ARGV, 4 do
  local key, action, target, data = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if mark_done(key) == 1 then
    added = added + 1
    if action == 'follow' then
      redis.call('HSET', KEYS[6], target, data)
      redis.call('HSET', KEYS[7], target, ARGV[5])
      stored[#stored + 1] = target
    elseif action == 'end' then
      local reason = cjson.decode(data)['reason']
      redis.call('HINCRBY', KEYS[4], '$CONVERSATION_END_PREFIX' .. reason, 1)
      if reason ~= 'complete' then redis.call('HSET', KEYS[8], target, data) end
    end
  end
end
count_done(added, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6])
table.insert(stored, 1, added)
return stored
