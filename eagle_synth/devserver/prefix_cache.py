"""PrefixCache: a cheap stand-in for SGLang's radix cache, for `cached_tokens` and /flush_cache."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence

# Cache granularity: prefixes are remembered per block of this many tokens, so cached_tokens
# is a multiple of it (real SGLang with page size 1 is exact to the token).
BLOCK_TOKENS = 16
# Blocks kept before the least recently used are evicted (a few tens of MB at most).
MAX_BLOCKS = 200_000


class PrefixCache:
    """Remembers token prefixes seen before, to report how many prompt tokens were cached.

    Behaviour: a sequence is remembered as the chain of its full blocks of `block_tokens`
    (each keyed by the hash of everything before it, so equal blocks at different places do not
    collide). `lookup` counts the leading blocks already known, capped at len(prompt) - 1
    because SGLang always computes at least one token. Least recently used blocks are evicted
    past `max_blocks`.
    """

    def __init__(self, *, block_tokens: int = BLOCK_TOKENS, max_blocks: int = MAX_BLOCKS) -> None:
        self.block_tokens, self.max_blocks = block_tokens, max_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def _keys(self, ids: Sequence[int]) -> list[int]:
        b = self.block_tokens
        blocks = (tuple(ids[start : start + b]) for start in range(0, len(ids) - b + 1, b))
        return list(itertools.accumulate(blocks, lambda key, block: hash((key, block)), initial=0))[1:]

    def lookup(self, prompt_ids: Sequence[int]) -> int:
        """Tokens of `prompt_ids` already cached."""
        keys = self._keys(prompt_ids)
        with self._lock:
            known = list(itertools.takewhile(self._blocks.__contains__, keys))
            for key in known:
                self._blocks.move_to_end(key)
        return min(len(known) * self.block_tokens, max(len(prompt_ids) - 1, 0))

    def insert(self, ids: Sequence[int]) -> None:
        """Remember a finished sequence (prompt + output), as SGLang does on completion."""
        keys = self._keys(ids)
        with self._lock:
            for key in keys:
                self._blocks[key] = None
                self._blocks.move_to_end(key)
            while len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)

    def flush(self) -> None:
        """Forget everything (POST /flush_cache)."""
        with self._lock:
            self._blocks.clear()
