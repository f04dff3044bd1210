"""Render conversations' next turns in a small pool of processes, off the worker's GIL.

The worker is one process whose threads keep a server full; Jinja rendering and decoding are
Python and hold the GIL. So next turns (eagle_synth.conversation.next_turn) are rendered in
`processes` spawned children that each load the campaign's stored tokenizer once. Spawned,
not forked: the worker has threads (the in-flight loop, Redis connections) a fork would copy
mid-flight. Children are told nothing but a folder and plain job dicts; they never touch
Redis or the queue.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

from eagle_synth.errors import EagleSynthError

# Start method of rendering processes (see the module docstring).
START_METHOD = "spawn"

_tokenizer = None


def _init(folder: str) -> None:
    global _tokenizer
    # One process per renderer slot already: the Rust tokenizer's own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from eagle_synth.templating import load_tokenizer

    _tokenizer = load_tokenizer(folder)


def _identity() -> tuple[str, str]:
    """Fingerprint and chat template hash of the tokenizer this process loaded."""
    from eagle_synth.templating import tokenizer_facts

    facts = tokenizer_facts(_tokenizer)
    return facts.fingerprint, facts.chat_template_hash


def _render(jobs: list[dict]) -> list[tuple]:
    """For each job: ("ready", ids, next state dict) or ("end", reason, message)."""
    from eagle_synth.conversation import ConversationState, next_turn

    out: list[tuple] = []
    for job in jobs:
        try:
            turn = next_turn(
                _tokenizer,
                ConversationState.from_dict(job["state"]),
                job["output_ids"],
                finish_reason=job["finish_reason"],
                matched=job["matched"],
                eos_token_ids=job["eos_token_ids"],
                think_close_id=job["think_close_id"],
                max_prompt_tokens=job["max_prompt_tokens"],
                tool_format=job.get("tool_format"),
            )
        except Exception as exc:  # a conversation the contract cannot handle ends; the others go on
            out.append(("end", "template-error", f"{type(exc).__name__}: {exc}"))
            continue
        if turn.end is not None:
            out.append(("end", turn.end, turn.message))
        else:
            assert turn.ids is not None and turn.state is not None
            out.append(("ready", turn.ids, turn.state.to_dict()))
    return out


def _count_tool_calls(jobs: list[dict]) -> list[int]:
    """For each job: how many tool calls its answer makes, parsed in the campaign's format (the
    calls before a fault when one does not parse): the record's `tool_calls`."""
    from eagle_synth.conversation import parse_answer

    counts = []
    for job in jobs:
        parsed, _ = parse_answer(
            _tokenizer,
            job["output_ids"],
            eos_token_ids=job["eos_token_ids"],
            matched=job["matched"],
            think_close_id=job["think_close_id"],
            tool_format=job["tool_format"],
            tools=job["tools"],
        )
        counts.append(len(parsed.tool_calls))
    return counts


class RendererMismatch(EagleSynthError, RuntimeError):
    """The stored tokenizer is not the campaign's (fingerprint or template differs)."""


class Renderer:
    """A pool of `processes` rendering processes for one stored tokenizer.

    Parameters:
        folder: the unpacked tokenizer files (eagle_synth.state.tokenizer_store.fetch_tokenizer).
        processes: pool size.
        fingerprint, chat_template_hash: what the campaign was made with; the loaded
            tokenizer must match both or RendererMismatch is raised (nothing is rendered).
    """

    def __init__(self, *, folder: Path, processes: int, fingerprint: str, chat_template_hash: str) -> None:
        self.folder = folder
        self.processes = max(1, processes)
        self.expected = (fingerprint, chat_template_hash)
        self._pool = ProcessPoolExecutor(
            max_workers=self.processes,
            initializer=_init,
            initargs=(str(folder),),
            mp_context=multiprocessing.get_context(START_METHOD),
        )
        try:
            found = self._pool.submit(_identity).result()
        except BaseException:
            self._pool.shutdown(cancel_futures=True)
            raise
        if tuple(found) != self.expected:
            self._pool.shutdown(cancel_futures=True)
            raise RendererMismatch(
                f"the tokenizer stored for this campaign renders as fingerprint {found[0]}, template {found[1]}; "
                f"the campaign was made with {self.expected[0]}, template {self.expected[1]}: refusing to render "
                "(run the campaign's `eagle-synth enqueue ... --history own` again to store the right one)"
            )

    def submit(self, jobs: list[dict]) -> Future:
        """Render jobs (dicts: state, output_ids, finish_reason, matched, eos_token_ids,
        think_close_id, max_prompt_tokens, tool_format); the future gives one result per job."""
        return self._pool.submit(_render, jobs)

    def count_tool_calls(self, jobs: list[dict]) -> Future:
        """Count the tool calls of answers (the same job dicts); the future gives one int per job."""
        return self._pool.submit(_count_tool_calls, jobs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
