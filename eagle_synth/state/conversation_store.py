"""Conversation state in Redis (`--history own`): follow-up outbox, ends, counts.

A follow-up turn moves commit -> ready -> form -> sent, each change one Lua script that checks
the entry's owner (a worker process with a liveness key); entries of a dead process are adopted
by compare-and-set and carried on from their state. docs/reliability.md ("Conversations") walks
through every step and every crash between them.
"""

from __future__ import annotations

import json
from collections import Counter
from itertools import chain
from typing import cast

from eagle_synth.conversation import END_COMPLETE, END_REASONS
from eagle_synth.state.campaign import EVENTS_MAXLEN, Campaign
from eagle_synth.state.fence import Fence
from eagle_synth.state.keys import CONVERSATIONS, conversation_end_counter
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import pipelined, text

# Owner field prefix of a formed batch (plain fields are turn keys).
BATCH_FIELD_PREFIX = "batch:"
# Entries of the ends hash read at most for `failed`'s examples.
ENDS_SCANNED_FOR_EXAMPLES = 10_000
# What a commit does for one record beside marking it done.
FOLLOW = "follow"
END = "end"
NOTHING = ""

_COMMIT = LuaScript("failure_reason", "mark_done_lib", "followup_commit")
_READY = LuaScript("followup_ready")
_FORM = LuaScript("followup_form")
_ADOPT = LuaScript("followup_adopt")


def end_json(
    *, reason: str, conversation: str, turns: int, row_id: str, source: str, message: str = "", at: float = 0.0
) -> str:
    """What is kept about a conversation that stopped; `turns` is how many turns it has records for."""
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
    """The follow-up outbox, ends and counts of `campaign` (its keys and client; see the module docstring)."""

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
        tokens_cached: int = 0,
        fence: Fence | None = None,
    ) -> tuple[int, set[str]]:
        """Mark keys done and store each newly done one's follow-up or end (`entries`: (key, action,
        target, data) as followup_commit.lua takes them); with a fence, only while the batch lease is
        the writer's (else LeaseLost). Returns how many keys were newly done and the turn keys stored."""
        if not entries:
            return 0, set()
        k = self.keys
        names = (k.done, k.failed, k.failed_reasons, k.counters, k.events, k.followups, k.followup_owners)
        counts = (tokens_in, tokens_out, repaired, EVENTS_MAXLEN, owner, tokens_cached)
        keys = (*names, k.conversation_ends, k.enqueued)
        args = (*counts, *chain(*entries))
        if fence is not None:
            reply = fence.run_script(self.client, _COMMIT, keys, args, release=[e[0] for e in entries])
        else:
            reply = _COMMIT(self.client, keys, args)
        return int(reply[0]), {key.decode() for key in reply[1:]}

    def ready(self, entries: list[tuple[str, str, str, bytes | str]], *, owner: str) -> set[str]:
        """Store rendered turns (action "ready") or the conversations' ends (action "end");
        returns the turn keys that were still this owner's (the rest were adopted meanwhile)."""
        if not entries:
            return set()
        k = self.keys
        names = (k.enqueued, k.followups, k.followup_owners, k.counters, k.conversation_ends)
        return {key.decode() for key in _READY(self.client, names, (owner, *chain(*entries)))}

    def form(self, *, owner: str, batch: str, payload: bytes, keys: list[str]) -> set[str]:
        """Turn rendered entries into one batch entry; returns keys not held (nothing formed then)."""
        k = self.keys
        lost = _FORM(self.client, (k.followups, k.followup_owners, k.followup_batches), (owner, batch, payload, *keys))
        return {key.decode() for key in lost}

    def sent(self, batch: str) -> None:
        """A formed batch is on the queue: forget it."""
        k = self.keys
        pipelined(
            self.client, ("hdel", k.followup_batches, batch), ("hdel", k.followup_owners, BATCH_FIELD_PREFIX + batch)
        )

    @staticmethod
    def campaigns_with_entries(client, names: list[str]) -> list[str]:
        """Those of the named campaigns whose outbox holds entries (one round trip)."""
        counts = pipelined(client, *(("hlen", Campaign(client, name).keys.followup_owners) for name in names))
        return [name for name, count in zip(names, counts) if count]

    def owners(self) -> dict[str, str]:
        """Every outbox field and the process holding it."""
        return {text(k): text(v) for k, v in self.client.hgetall(self.keys.followup_owners).items()}

    def adopt(self, fields: list[str], *, owner: str, dead: str) -> list[str]:
        """Take over fields a dead process held; returns those taken (compare-and-set)."""
        if not fields:
            return []
        taken = _ADOPT(self.client, (self.keys.followup_owners,), (owner, dead, *fields))
        return [text(field) for field in taken]

    # Our clients return bytes; redis-py types replies as bytes | str.
    def entry(self, key: str) -> bytes | None:
        return cast("bytes | None", self.client.hget(self.keys.followups, key))

    def batch(self, batch: str) -> bytes | None:
        return cast("bytes | None", self.client.hget(self.keys.followup_batches, batch))

    # reading ----------------------------------------------------------------------------
    def waiting(self) -> int:
        """Follow-up turns between their previous turn's commit and the queue."""
        k = self.keys
        return sum(map(int, pipelined(self.client, ("hlen", k.followups), ("hlen", k.followup_batches))))

    def counts(self) -> dict:
        """Conversations: total, done, in progress, stopped by reason, follow-ups waiting (a
        failed prompt is a conversation stopped by that failure; `retry-failed` resumes it)."""
        counts = self.campaign.progress().counters
        ended = {reason: counts.get(conversation_end_counter(reason), 0) for reason in END_REASONS}
        stopped = Counter({reason: count for reason, count in ended.items() if reason != END_COMPLETE and count})
        stopped.update(self.campaign.failure_counts())
        total = counts.get(CONVERSATIONS, 0)
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
        out: dict[str, dict] = {
            reason: {"count": count, "examples": []}
            for reason in END_REASONS
            if reason != END_COMPLETE and (count := counts.get(conversation_end_counter(reason), 0))
        }
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
