"""Render conversations' next turns (eagle_synth.conversation.next_turn) in a small pool of
processes, off the GIL the worker's threads need to keep a server full. Each child loads the
campaign's stored tokenizer once and gets only plain job dicts (never Redis or the queue); each
job's result is a NextTurn (msgspec structs pickle as they are).
Spawned, not forked: a fork would copy the worker's threads (in-flight loop, Redis) mid-flight.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from eagle_synth.conversation import END_TEMPLATE_ERROR, ConversationState, NextTurn, next_turn, parse_answer
from eagle_synth.errors import RendererMismatch
from eagle_synth.templating import load_tokenizer, tokenizer_facts

START_METHOD = "spawn"  # see the module docstring
_tokenizer = None


def _init(folder: str, trust_remote_code: bool) -> None:
    global _tokenizer
    # One process per renderer slot already: the Rust tokenizer's own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tokenizer = load_tokenizer(folder, trust_remote_code=trust_remote_code)


def _identity() -> tuple[str, str]:  # of the tokenizer this process loaded
    facts = tokenizer_facts(_tokenizer)
    return facts.fingerprint, facts.chat_template_hash


def _render(jobs: list[dict]) -> list[NextTurn]:
    """For each job, its NextTurn: the next prompt's ids and state, or why the conversation ends."""
    out: list[NextTurn] = []
    for job in jobs:
        try:  # the job's other keys are next_turn's keyword arguments
            turn = next_turn(_tokenizer, ConversationState.from_dict(job.pop("state")), job.pop("output_ids"), **job)
        except Exception as exc:  # a conversation the contract cannot handle ends; the others go on
            turn = NextTurn(end=END_TEMPLATE_ERROR, message=f"{type(exc).__name__}: {exc}")
        out.append(turn)
    return out


def _count_tool_calls(jobs: list[dict]) -> list[int]:
    """For each job: the tool calls its answer makes in the campaign's format (those before a
    fault when one does not parse): the record's `tool_calls`."""
    return [len(parse_answer(_tokenizer, job.pop("output_ids"), **job)[0].tool_calls) for job in jobs]


class Renderer:
    """A pool of `processes` rendering processes for the tokenizer in `folder` (unpacked from
    Redis, or with `trust_remote_code` the worker's local model folder, whose files were checked),
    which must match the campaign's `fingerprint` and `chat_template_hash` (else RendererMismatch)."""

    def __init__(
        self,
        *,
        folder: Path,
        processes: int,
        fingerprint: str,
        chat_template_hash: str,
        trust_remote_code: bool = False,
    ) -> None:
        expected = (fingerprint, chat_template_hash)
        self._pool = ProcessPoolExecutor(
            max_workers=max(1, processes),
            initializer=_init,
            initargs=(str(folder), trust_remote_code),
            mp_context=multiprocessing.get_context(START_METHOD),
        )
        try:
            found = self._pool.submit(_identity).result()
            if tuple(found) != expected:
                raise RendererMismatch(
                    f"the tokenizer at {folder} renders as fingerprint {found[0]}, template {found[1]}; "
                    f"the campaign was made with {expected[0]}, template {expected[1]}: refusing to render "
                    "(run the campaign's `eagle-synth enqueue ... --history own` again to store the right one)"
                )
        except BaseException:
            self._pool.shutdown(cancel_futures=True)
            raise

    def submit(self, jobs: list[dict]) -> Future:  # one NextTurn per job (_render)
        return self._pool.submit(_render, jobs)

    def count_tool_calls(self, jobs: list[dict]) -> Future:  # one int per job
        return self._pool.submit(_count_tool_calls, jobs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
