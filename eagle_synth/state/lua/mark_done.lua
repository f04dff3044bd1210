-- KEYS: as mark_done_lib.lua, then the enqueued set. ARGV: tokens_in, tokens_out, repaired, events
-- maxlen, tokens_cached, then prompt keys. One round trip for what a finished batch changes; counts
-- only new keys.
local added = 0
for i = 6, #ARGV do added = added + mark_done(ARGV[i]) end
count_done(added, ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
return added
