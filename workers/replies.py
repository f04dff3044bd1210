"""Check one /generate reply item before it becomes a record.

A 200 is not proof of a good answer: an item that is not an object, lacks `output_ids`, or
holds ids that are not ints inside the vocabulary must never be written as a record. Such a
reply is a transient error (`BadResponse`): the prompt is tried again and, if the server keeps
answering that way, fails as `bad-response`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.client import TransientError


class BadResponse(TransientError):
    """The server answered 200 with an item that is not a usable reply."""


class PromptMismatch(Exception):
    """The server says it conditioned on another number of prompt tokens than we sent."""


@dataclass(frozen=True, slots=True)
class GeneratedItem:
    """One checked reply item.

    Parameters:
        output_ids: generated ids, after the old-SGLang prompt-tail repair.
        finish_type: "stop", "length" or "abort".
        finish_matched: the stop id or string, if any.
        prompt_tokens, completion_tokens, cached_tokens: the server's counts.
        e2e_latency: server-side seconds, if reported.
        repaired_prefix: ids dropped from the front of output_ids.
    """

    output_ids: list[int]
    finish_type: str
    finish_matched: int | str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float | None
    repaired_prefix: int

    @property
    def aborted(self) -> bool:
        return self.finish_type == "abort"


def _ids(value: Any, *, vocab_size: int) -> list[int]:
    if not isinstance(value, list):
        raise BadResponse(f"output_ids is {type(value).__name__}, not a list")
    for token in value:
        if type(token) is not int:
            raise BadResponse(f"output_ids holds {token!r}, not an int")
        if not 0 <= token < vocab_size:
            raise BadResponse(f"output_ids holds {token}, outside the vocabulary [0, {vocab_size})")
    return value


def parse_generate_item(item: Any, *, vocab_size: int, prompt_len: int) -> GeneratedItem:
    """Check and normalise one reply item; raises BadResponse or PromptMismatch."""
    if not isinstance(item, dict):
        raise BadResponse(f"reply item is {type(item).__name__}, not an object")
    meta = item.get("meta_info")
    if not isinstance(meta, dict):
        raise BadResponse(f"meta_info is {type(meta).__name__}, not an object")
    finish = meta.get("finish_reason")
    if isinstance(finish, str):
        finish = {"type": finish}
    if not isinstance(finish, dict) or not isinstance(finish.get("type"), str):
        raise BadResponse(f"finish_reason {finish!r} has no type")
    kind = finish["type"]
    if kind == "abort":
        return GeneratedItem([], "abort", None, prompt_len, 0, 0, None, 0)
    if "output_ids" not in item:
        raise BadResponse("the reply has no output_ids")
    output_ids = _ids(item["output_ids"], vocab_size=vocab_size)
    prompt_tokens = meta.get("prompt_tokens", prompt_len)
    if type(prompt_tokens) is not int:
        raise BadResponse(f"prompt_tokens is {prompt_tokens!r}")
    if prompt_tokens != prompt_len:
        raise PromptMismatch(f"the server counted {prompt_tokens} prompt tokens, we sent {prompt_len}")
    completion = meta.get("completion_tokens")
    repaired = 0
    if type(completion) is int and len(output_ids) > completion >= 0:
        # SGLang before ~0.5.5 prefixed output_ids with prompt-tail ids.
        repaired = len(output_ids) - completion
        output_ids = output_ids[repaired:]
    cached = meta.get("cached_tokens")
    latency = meta.get("e2e_latency")
    return GeneratedItem(
        output_ids=output_ids,
        finish_type=kind,
        finish_matched=finish.get("matched"),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion if type(completion) is int else len(output_ids),
        cached_tokens=cached if type(cached) is int else 0,
        e2e_latency=float(latency) if isinstance(latency, (int, float)) else None,
        repaired_prefix=repaired,
    )
