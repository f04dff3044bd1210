"""Conversation state in Redis (`--history own`): follow-up outbox, ends, counts.

A conversation's next turn moves through these states, each change one Lua script:

1. **commit** (the worker that commits turn k): turn k's key is marked done and, in the same
   script and only if it was newly marked, either the conversation's end is recorded or an
   outbox entry `to render` is stored for turn k+1's key (the previous turn's output and
   state, no ids yet). A turn is newly marked done exactly once, so turn k+1 gets exactly one
   entry, whatever crashed or ran twice before.
2. **ready**: a renderer made turn k+1's prompt ids. Its key joins the campaign's enqueued set
   and the entry becomes `rendered`; or the conversation ends (template error, too long).
3. **form**: up to a batch of rendered entries become one batch entry (a whole payload, its
   batch id fixed from its keys) and leave the per-turn outbox.
4. **sent**: the batch was published; its entry goes.

Every entry names the worker process that holds it (`followup_owners`); that process keeps a
liveness key alive. Entries of a dead process are adopted by another (compare-and-set on the
owner), which carries on from the state the entry is in: render again (deterministic),
form, or publish the stored payload again (the same batch id, so a second copy is skipped by
the done set and the batch lease). Every step checks the owner, so two processes never both
advance one entry.
"""

from __future__ import annotations

import json

from eagle_synth.conversation import END_COMPLETE, END_REASONS
from eagle_synth.state import counters
from eagle_synth.state.campaign import EVENTS_MAXLEN, MARK_DONE_LUA, Campaign
from eagle_synth.state.counters import in_lua
from eagle_synth.state.fence import Fence
from eagle_synth.state.redis_client import text

# Owner field prefix of a formed batch (plain fields are turn keys).
BATCH_FIELD_PREFIX = "batch:"
# Entries of the ends hash read at most for `failed`'s examples.
ENDS_SCANNED_FOR_EXAMPLES = 10_000
# What a commit does for one record beside marking it done.
FOLLOW = "follow"
END = "end"
NOTHING = ""

# KEYS: done, failed, failed reasons, counters, events, followups, owners, ends, enqueued.
# ARGV: tokens_in, tokens_out, repaired, events maxlen, owner, then per record:
# key, action (follow | end | ''), target (next turn key | conversation key), data.
# Returns {number newly done, the next turn keys stored...}.
_COMMIT = MARK_DONE_LUA + in_lua(
    """
local added = 0
local stored = {}
for i = 6, #ARGV, 4 do
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
count_done(added, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
table.insert(stored, 1, added)
return stored
"""
)
# KEYS: enqueued, followups, owners, counters, ends. ARGV: owner, then per entry:
# turn key, action (ready | end), conversation key, data (rendered entry | end JSON).
# Returns the turn keys this owner still held (the others were adopted meanwhile).
_READY = in_lua(
    """
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
"""
)
# KEYS: followups, owners, batches. ARGV: owner, batch id, payload, then turn keys.
# Returns the keys this owner does not hold (then nothing changed), or {} when formed.
_FORM = """
local lost = {}
for i = 4, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) ~= ARGV[1] or redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
    lost[#lost + 1] = ARGV[i]
  end
end
if #lost > 0 then return lost end
for i = 4, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[2], 'batch:' .. ARGV[2], ARGV[1])
return lost
"""
# KEYS: owners. ARGV: new owner, dead owner, then fields. Returns the fields taken over.
_ADOPT = """
local taken = {}
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[2] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[1])
    taken[#taken + 1] = ARGV[i]
  end
end
return taken
"""


def end_json(
    *, reason: str, conversation: str, turns: int, row_id: str, source: str, message: str = "", at: float = 0.0
) -> str:
    """What is kept about a conversation that stopped (and counted by reason); `turns` is the
    number of turns it has records for."""
    return json.dumps(
        {
            "reason": reason,
            "conversation": conversation,
            "turns": turns,
            "row_id": row_id,
            "source": source,
            "message": message[:2000],
            "at": at,
        }
    )


class ConversationStore:
    """The follow-up outbox, ends and counts of one campaign (see the module docstring).

    Parameters:
        campaign: the campaign whose keys and client are used.
    """

    def __init__(self, campaign: Campaign) -> None:
        self.campaign = campaign
        self.client = campaign.client
        self.keys = campaign.keys

    # worker side ------------------------------------------------------------------------
    def commit(
        self,
        entries: list[tuple[str, str, str, bytes | str]],
        *,
        owner: str,
        tokens_in: int,
        tokens_out: int,
        repaired: int = 0,
        fence: Fence | None = None,
    ) -> tuple[int, set[str]]:
        """Mark keys done and, for each newly done one, store its follow-up or its end (with a
        fence: only while its batch lease is the writer's, else LeaseLost and nothing changes).

        `entries` are (key, action, target, data) with action FOLLOW (target: next turn key,
        data: the entry to render), END (target: conversation key, data: end_json) or NOTHING.
        Returns how many keys were newly done and the next turn keys stored.
        """
        if not entries:
            return 0, set()
        k = self.keys
        args: list = [tokens_in, tokens_out, repaired, EVENTS_MAXLEN, owner]
        for entry in entries:
            args.extend(entry)
        names = (k.done, k.failed, k.failed_reasons, k.counters, k.events, k.followups, k.followup_owners)
        if fence is not None:
            released = [entry[0] for entry in entries]
            reply = fence.eval(
                self.client, _COMMIT, 9, *names, k.conversation_ends, k.enqueued, *args, release=released
            )
        else:
            reply = self.client.eval(_COMMIT, 9, *names, k.conversation_ends, k.enqueued, *args)
        return int(reply[0]), {key.decode() for key in reply[1:]}

    def ready(self, entries: list[tuple[str, str, str, bytes | str]], *, owner: str) -> set[str]:
        """Store rendered turns (action "ready") or the conversations' ends (action "end").

        Returns the turn keys that were still this owner's (the rest were adopted meanwhile).
        """
        if not entries:
            return set()
        k = self.keys
        args: list = [owner]
        for entry in entries:
            args.extend(entry)
        held = self.client.eval(
            _READY, 5, k.enqueued, k.followups, k.followup_owners, k.counters, k.conversation_ends, *args
        )
        return {key.decode() for key in held}

    def form(self, *, owner: str, batch: str, payload: bytes, keys: list[str]) -> set[str]:
        """Turn rendered entries into one batch entry; returns keys not held (nothing formed then)."""
        k = self.keys
        lost = self.client.eval(
            _FORM, 3, k.followups, k.followup_owners, k.followup_batches, owner, batch, payload, *keys
        )
        return {key.decode() for key in lost}

    def sent(self, batch: str) -> None:
        """A formed batch is on the queue: forget it."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.keys.followup_batches, batch)
        pipe.hdel(self.keys.followup_owners, BATCH_FIELD_PREFIX + batch)
        pipe.execute()

    @staticmethod
    def campaigns_with_entries(client, names: list[str]) -> list[str]:
        """Those of the named campaigns whose outbox holds entries (one round trip)."""
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.hlen(Campaign(client, name).keys.followup_owners)
        return [name for name, count in zip(names, pipe.execute()) if count]

    def owners(self) -> dict[str, str]:
        """Every outbox field and the process holding it."""
        return {text(k): text(v) for k, v in self.client.hgetall(self.keys.followup_owners).items()}

    def adopt(self, fields: list[str], *, owner: str, dead: str) -> list[str]:
        """Take over fields a dead process held; returns those taken (compare-and-set)."""
        if not fields:
            return []
        taken = self.client.eval(_ADOPT, 1, self.keys.followup_owners, owner, dead, *fields)
        return [text(field) for field in taken]

    def entry(self, key: str) -> bytes | None:
        return _as_bytes(self.client.hget(self.keys.followups, key))

    def batch(self, batch: str) -> bytes | None:
        return _as_bytes(self.client.hget(self.keys.followup_batches, batch))

    # reading ----------------------------------------------------------------------------
    def waiting(self) -> int:
        """Follow-up turns between their previous turn's commit and the queue."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hlen(self.keys.followups)
        pipe.hlen(self.keys.followup_batches)
        turns, batches = pipe.execute()
        return int(turns) + int(batches)

    def counts(self) -> dict:
        """Conversations: total, done, in progress, stopped by reason, follow-ups waiting.

        In a `--history own` campaign every prompt is a conversation's turn, so a failed prompt
        is a conversation stopped by that failure (`retry-failed` resumes it).
        """
        progress = self.campaign.progress()
        counts = progress.counters
        ended = {reason: counts.get(counters.conversation_end(reason), 0) for reason in END_REASONS}
        stopped = {reason: count for reason, count in ended.items() if reason != END_COMPLETE and count}
        for reason, count in self.campaign.failure_counts().items():
            stopped[reason] = stopped.get(reason, 0) + count
        total = counts.get(counters.CONVERSATIONS, 0)
        done = ended[END_COMPLETE]
        return {
            "total": total,
            "done": done,
            "in_progress": max(total - done - sum(stopped.values()), 0),
            "stopped": sum(stopped.values()),
            "stopped_by_reason": dict(sorted(stopped.items())),
            "followups_waiting": self.waiting(),
        }

    def stopped(self, *, examples: int = 5) -> dict[str, dict]:
        """Conversations that stopped early without a failure, by reason: count and a few
        examples (each: conversation, turns answered, row id, source, message)."""
        counts = self.campaign.progress().counters
        out: dict[str, dict] = {}
        for reason in END_REASONS:
            count = counts.get(counters.conversation_end(reason), 0)
            if reason != END_COMPLETE and count:
                out[reason] = {"count": count, "examples": []}
        wanted = examples * len(out)
        for seen, (_, raw) in enumerate(self.client.hscan_iter(self.keys.conversation_ends, count=500)):
            if not wanted or seen >= ENDS_SCANNED_FOR_EXAMPLES:
                break
            end = json.loads(raw)
            listed = out.get(end["reason"])
            if listed is not None and len(listed["examples"]) < examples:
                listed["examples"].append(end)
                wanted -= 1
        return out


def _as_bytes(raw: bytes | str | None) -> bytes | None:
    """A Redis reply as bytes (our clients return bytes; redis-py types replies as bytes | str)."""
    return raw.encode() if isinstance(raw, str) else raw
