"""One /generate reply item, checked and made into its record (docs/workers.md "Request safety").

A 200 is no proof of a good answer: a proxy or a buggy server can answer with no `output_ids`,
ids as strings or outside the vocabulary, or a prompt it cut (`--allow-auto-truncate`): training
data the model never produced, or not conditioned on the ids the record says. So, before any
record exists: a malformed item raises BadResponse (transient: asked again, finally
`bad-response`); `prompt_tokens` other than the ids sent raises PromptMismatch (asking again
gives the same: `prompt-mismatch`). A `stop` on a matched token id must end with that id
(SGLang keeps it in `output_ids`). An `abort` raises ReplyAborted (asked again). What passes
becomes the Record, with what it takes from the request (`Sent`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from eagle_synth.errors import (
    BadResponse,
    PromptMismatch,
    ReplyAborted,
)
from eagle_synth.payload import PromptItem
from eagle_synth.records import Record
from eagle_synth.sampling import ServerSampling

# finish_reason types SGLang and vLLM report; anything else is a shape we do not know how to record.
FINISH_TYPES = frozenset({"stop", "length", "abort"})
# Longest excerpt of a bad value quoted in an error message.
EXCERPT_CHARS = 80


@dataclass(frozen=True, slots=True)
class Sent:
    """One prompt as it was sent: all its record takes from outside the reply.

    Parameters:
        prompt: the queued item (key, row, sample, turn, ids, source, conversation, variant).
        campaign: the campaign's name.
        sampling: what the server was asked to sample with (the record's `sampling`; vLLM's
            reply is checked against its max_new_tokens).
        server: the server's URL.
        worker: this worker's node name.
        backend: the server's kind (workers/backends/).
    """

    prompt: PromptItem
    campaign: str = ""
    sampling: ServerSampling = field(default_factory=ServerSampling)
    server: str = ""
    worker: str = ""
    backend: str = "sglang"

    def record(
        self,
        *,
        output_ids: list[int],
        finish_reason: str,
        finish_matched: int | str | None,
        completion_tokens: int,
        cached_tokens: int = 0,
        e2e_latency: float | None = None,
        repaired_prefix: int = 0,
    ) -> Record:
        """The record of this prompt with a checked reply's values (the only place one is made)."""
        prompt = self.prompt
        return Record(
            key=prompt.key,
            id=prompt.row_id,
            sample=prompt.sample,
            turn=prompt.turn,
            prompt_ids=prompt.ids,
            output_ids=output_ids,
            finish_reason=finish_reason,
            finish_matched=finish_matched,
            prompt_tokens=len(prompt.ids),
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            campaign=self.campaign,
            sampling=self.sampling.as_map(),
            source=prompt.source,
            server=self.server,
            worker=self.worker,
            e2e_latency=e2e_latency,
            created_at=time.time(),
            repaired_prefix=repaired_prefix,
            backend=self.backend,
            conversation=prompt.conversation["key"] if prompt.conversation else None,
            variant=prompt.variant,
        )


def excerpt(value: object) -> str:
    text = repr(value)
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3] + "..."


def kind_of(value: object) -> str:  # "a list", "an int", ... for messages
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def is_token_int(value: object) -> bool:
    return type(value) is int  # bool is a subclass of int, and never a token id or a count


def _finish(meta: dict) -> tuple[str, int | str | None]:
    """(type, matched) from meta_info.finish_reason; BadResponse for any other shape."""
    if (finish := meta.get("finish_reason")) is None:
        raise BadResponse("meta_info has no finish_reason")
    if isinstance(finish, str):  # very old SGLang reported the bare type
        finish = {"type": finish}
    if not isinstance(finish, dict):
        raise BadResponse(f"finish_reason is {kind_of(finish)}, not an object: {excerpt(finish)}")
    kind = finish.get("type")
    if kind not in FINISH_TYPES:
        raise BadResponse(f"finish_reason has an unknown type {excerpt(kind)} (expected one of {sorted(FINISH_TYPES)})")
    matched = finish.get("matched")
    if kind != "stop":
        return kind, None
    if matched is not None and not is_token_int(matched) and not isinstance(matched, str):
        raise BadResponse(f"finish_reason.matched is neither a token id nor a stop string: {excerpt(matched)}")
    return kind, matched


def checked_ids(ids: object, *, field: str, vocab_size: int) -> list[int]:
    """`ids` if it is a list of ints inside [0, vocab_size); BadResponse naming `field` else."""
    if not isinstance(ids, list):
        raise BadResponse(f"{field} is {kind_of(ids)}, not a list: {excerpt(ids)}")
    # C-speed checks first (records run to thousands of ids); find the culprit only on failure.
    if ids and (set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) >= vocab_size):
        position, bad = next((i, v) for i, v in enumerate(ids) if not is_token_int(v) or not 0 <= v < vocab_size)
        if not is_token_int(bad):
            raise BadResponse(f"{field}[{position}] is not an int: {excerpt(bad)}")
        raise BadResponse(f"{field}[{position}] = {bad} is outside the vocabulary [0, {vocab_size})")
    return ids


def _count(meta: dict, name: str) -> int | None:
    """A non-negative int count from meta_info, None if absent; BadResponse if malformed."""
    if (value := meta.get(name)) is not None and (not is_token_int(value) or value < 0):
        raise BadResponse(f"meta_info.{name} is not a non-negative int: {excerpt(value)}")
    return value


def parse_generate_item(item: object, *, vocab_size: int, sent: Sent) -> Record:
    """Check one /generate reply item against the prompt `sent` (module docstring): its record."""
    if not isinstance(item, dict):
        raise BadResponse(f"the reply item is {kind_of(item)}, not an object: {excerpt(item)}")
    if "meta_info" not in item:
        raise BadResponse("the reply item has no meta_info")
    meta = item["meta_info"]
    if not isinstance(meta, dict):
        raise BadResponse(f"meta_info is {kind_of(meta)}, not an object: {excerpt(meta)}")
    kind, matched = _finish(meta)
    if kind == "abort":  # whatever came with it is thrown away: the prompt is asked again
        raise ReplyAborted("the server aborted this prompt")
    if "output_ids" not in item:
        raise BadResponse("the reply item has no output_ids")
    output_ids = checked_ids(item["output_ids"], field="output_ids", vocab_size=vocab_size)
    prompt_ids = sent.prompt.ids
    prompt_len = len(prompt_ids)
    reported_prompt = _count(meta, "prompt_tokens")
    if reported_prompt is not None and reported_prompt != prompt_len:
        raise PromptMismatch(
            f"the server reports a prompt of {reported_prompt} tokens for the {prompt_len} sent "
            "(it cut or changed the prompt: is it launched with --allow-auto-truncate?)"
        )
    completion = _count(meta, "completion_tokens")
    repaired = 0
    if completion is None:
        completion = len(output_ids)
    elif len(output_ids) > completion:
        # Old SGLang (< ~0.5.5) prefixed output_ids with up to 5 prompt-tail ids: repaired only when
        # the surplus is exactly the prompt's tail, as dropping any other could cut real output.
        repaired = len(output_ids) - completion
        if repaired > prompt_len or output_ids[:repaired] != prompt_ids[-repaired:]:
            raise BadResponse(
                f"output_ids has {len(output_ids)} ids but completion_tokens says {completion}, and the "
                f"{repaired} extra leading ids are not the prompt's tail: not repairable"
            )
        output_ids = output_ids[repaired:]
    elif len(output_ids) < completion:
        raise BadResponse(f"output_ids has {len(output_ids)} ids but completion_tokens says {completion}")
    if kind == "stop" and is_token_int(matched) and (not output_ids or output_ids[-1] != matched):
        raise BadResponse(f"finish_reason says it stopped on token {matched}, but output_ids does not end with it")

    cached = meta.get("cached_tokens")
    latency = meta.get("e2e_latency")
    if not (isinstance(cached, int) and is_token_int(cached) and cached >= 0):
        cached = 0  # informational only: a missing or odd value is not worth losing the record
    return sent.record(
        output_ids=output_ids,
        finish_reason=kind,
        finish_matched=matched,
        completion_tokens=completion,
        cached_tokens=cached,
        e2e_latency=float(latency) if isinstance(latency, (int, float)) and not isinstance(latency, bool) else None,
        repaired_prefix=repaired,
    )
