"""Prefix affinity: a prompt goes to the server that already holds its prefix in its cache.

SGLang's radix cache and vLLM's prefix cache skip the prefill of any prefix they still hold, but
only on the server that holds it. A conversation's next turn (`--history own`) resends every
earlier turn, and the samples of one prompt (`--n`, `--variants`) share it whole; sent to any
server by load alone, a follow-up with 8 servers finds its prefix 1 time in 8. So the in-flight
pool (workers/inflight.py) remembers, per prefix, the server it last sent one to, and sends the
next prompt of that prefix there while that server may take it (routable, a free ticket, one of
the prompt's allowed servers); otherwise to the least loaded allowed server, which is then the
one remembered. Affinity never makes a prompt wait for its server: a free ticket elsewhere is
never left idle for it. docs/workers.md "Prefix affinity".

The prefix of a conversation turn is its conversation; of any other prompt, its row: every
sample and variant of a prompt shares it whole, and with `--turns all` a row's later turn starts
with its earlier turn's prompt. Keys are per campaign.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from eagle_synth.payload import PromptItem

# Prefixes remembered per worker process, least recently used forgotten first: far more than the
# prompts a worker has open at once (--concurrency x batch size), at ~200 bytes an entry.
AFFINITY_ENTRIES = 100_000
# Environment variable turning affinity off ("0"), for measuring what it gains.
AFFINITY_ENV = "EAGLE_SYNTH_PREFIX_AFFINITY"
# Environment variable turning host queues off ("0") while keeping affinity on each host
# (workers/handoff.py), for measuring what they gain.
HOST_QUEUES_ENV = "EAGLE_SYNTH_HOST_QUEUES"


def affinity_enabled() -> bool:
    """False only when EAGLE_SYNTH_PREFIX_AFFINITY is "0"."""
    return os.environ.get(AFFINITY_ENV, "1").strip() != "0"


def host_queues_enabled() -> bool:
    """Whether a worker publishes next turns to its own host queue and consumes it: unless
    affinity or EAGLE_SYNTH_HOST_QUEUES is "0"."""
    return affinity_enabled() and os.environ.get(HOST_QUEUES_ENV, "1").strip() != "0"


def prefix_key(item: PromptItem) -> str:
    """What the prompts sharing `item`'s prefix have in common: its conversation, else its row."""
    if item.conversation:
        return f"conversation\n{item.conversation['key']}"
    return f"row\n{item.row_id}"


def least_loaded(allowed: Sequence[str], free: Mapping[str, int]) -> str:
    """The server with the most free tickets (the first listed among equals)."""
    return max(allowed, key=free.__getitem__)


class PrefixAffinity:
    """Maps (campaign, prefix key) to the server its last prompt went to, a bounded LRU map.

    `pick` chooses among `allowed` (servers that may take the prompt now, each with a free
    ticket in `free`) and remembers the choice. Used by the pool's event loop thread only.

    Parameters:
        capacity: prefixes remembered, least recently used forgotten first.
    """

    def __init__(self, capacity: int = AFFINITY_ENTRIES) -> None:
        self.capacity = capacity
        self._servers: OrderedDict[tuple[str, str], str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._servers)

    def pick(self, campaign: str, prefix: str | None, allowed: Sequence[str], free: Mapping[str, int]) -> str:
        """The remembered server if allowed, else the least loaded (now remembered)."""
        if prefix is None:
            return least_loaded(allowed, free)
        key = (campaign, prefix)
        remembered = self._servers.get(key)
        url = remembered if remembered is not None and remembered in allowed else least_loaded(allowed, free)
        self._servers[key] = url
        self._servers.move_to_end(key)
        if len(self._servers) > self.capacity:
            self._servers.popitem(last=False)
        return url
