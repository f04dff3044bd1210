-- KEYS: enqueued, followups, owners, counters, ends. ARGV: owner, then per entry: turn key,
-- action (ready | end), conversation key, data (rendered entry | end JSON). Returns the turn
-- keys this owner still held (the others were adopted meanwhile).
local done = {}
for i = 2, #ARGV, 4 do
  local key, action, conversation, data = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if redis.call('HGET', KEYS[3], key) == ARGV[1] then
    if action == 'ready' then
      redis.call('SADD', KEYS[1], key)
      redis.call('HSET', KEYS[2], key, data)
    else
      redis.call('HDEL', KEYS[2], key)
      redis.call('HDEL', KEYS[3], key)
      local reason = cjson.decode(data)['reason']
      redis.call('HINCRBY', KEYS[4], '$CONVERSATION_END_PREFIX' .. reason, 1)
      if reason ~= 'complete' then redis.call('HSET', KEYS[5], conversation, data) end
    end
    done[#done + 1] = key
  end
end
return done
