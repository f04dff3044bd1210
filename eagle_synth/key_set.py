"""A compact set of prompt keys for readers that drop repeats (a record can sit in two files).

A set of strings costs ~120 B a key (1.2 GB for 10M); this keeps 64-bit digests in an
open-addressing table a quarter to half full: 16-32 B a key. A digest collision would drop a
record: chance about n^2 / 2^65 (3e-6 for 10M), and `verify` would show it.
"""

from __future__ import annotations

from array import array
from hashlib import blake2b

# Slots of a new table (a power of two).
INITIAL_SLOTS = 1 << 12
# Hex digits of a 64-bit digest.
HEX_DIGITS = 16
# Grow (double) when this share of the slots is taken: lookups stay about one probe.
MAX_LOAD = 0.5


def _digest(key: str) -> int:
    # Prompt keys are 128-bit hex digests already (eagle_synth/payload.py): the XOR of their two
    # halves is the digest, at a fifth of blake2b's cost, and it tells apart keys that differ in
    # either half (keys written by hand, as in tests, often share one). 0 marks an empty slot,
    # so a key whose halves are equal is hashed instead.
    if len(key) == 2 * HEX_DIGITS:
        try:
            folded = int(key[:HEX_DIGITS], 16) ^ int(key[HEX_DIGITS:], 16)
        except ValueError:
            folded = 0
        if folded:
            return folded
    return int.from_bytes(blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little") or 1


class KeySet:
    """Remembers keys by 64-bit digest; `add` says whether a key is new."""

    def __init__(self) -> None:
        self._slots = array("Q", bytes(8 * INITIAL_SLOTS))
        self._mask = INITIAL_SLOTS - 1
        self._count = 0

    def add(self, key: str) -> bool:
        """Remember `key`; True if it was not there yet."""
        if self._insert(_digest(key)):
            self._count += 1
            if self._count > MAX_LOAD * len(self._slots):
                self._grow()
            return True
        return False

    def _insert(self, digest: int) -> bool:
        slots = self._slots
        mask = self._mask
        index = digest & mask
        while current := slots[index]:  # 0 is an empty slot
            if current == digest:
                return False
            index = (index + 1) & mask
        slots[index] = digest
        return True

    def _grow(self) -> None:
        old = self._slots
        self._slots = array("Q", bytes(8 * len(old) * 2))
        self._mask = len(self._slots) - 1
        for digest in old:
            if digest:
                self._insert(digest)
