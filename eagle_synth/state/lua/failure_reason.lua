-- A stored failure's reason, in the compact layout (`F1 <reason>\n...`, Failure.encode) or the
-- JSON one campaigns enqueued before it still hold.
local function failure_reason(raw)
  if string.sub(raw, 1, 3) == 'F1 ' then
    return string.sub(raw, 4, string.find(raw, '\n', 4, true) - 1)
  end
  return cjson.decode(raw)['reason']
end
