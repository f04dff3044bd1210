"""Token id arrays as bytes: little-endian uint32, the one binary form payloads and records use."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

# array typecode of a 4-byte unsigned int on every platform CPython supports.
_UINT32 = "I"
assert array(_UINT32).itemsize == 4


def pack_ids(ids: Sequence[int]) -> bytes:
    """Pack ids into little-endian uint32 bytes (ids must be 0 <= id < 2**32)."""
    arr = array(_UINT32, ids)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tobytes()


def unpack_ids(data: bytes) -> list[int]:
    """The inverse of pack_ids."""
    if len(data) % 4:
        raise ValueError(f"id bytes of length {len(data)} are not a multiple of 4")
    arr = array(_UINT32, data)
    if sys.byteorder != "little":
        arr.byteswap()
    return arr.tolist()
