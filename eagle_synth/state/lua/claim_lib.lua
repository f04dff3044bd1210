-- A claim value is `<lease key>\n<holder>`; it counts while that lease still names its holder.
local function claim_live(current)
  local cut = string.find(current, '\n', 1, true)
  return cut and redis.call('GET', string.sub(current, 1, cut - 1)) == string.sub(current, cut + 1)
end
