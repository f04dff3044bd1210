"""Template conversations into prompt ids on every core (Jinja rendering is single-threaded
Python): a pool of processes each loading the tokenizer once, conversations sharing their tools
in one batched call. A batch that fails is redone one conversation at a time, so only the one
the template rejects is skipped.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import groupby
from typing import TypeVar

from eagle_synth.errors import TemplateError
from eagle_synth.templating import load_tokenizer, render_prompt_ids, render_prompt_ids_batch

# Chunks submitted to the pool ahead of the one being consumed (bounds memory).
CHUNKS_AHEAD_PER_PROCESS = 3
# What the caller pairs with each chunk and gets back with its results (TemplatingPool.map).
_Context = TypeVar("_Context")


@dataclass(frozen=True, slots=True)
class TemplateJob:
    """How to load and apply the template; sent once to each pool process."""

    tokenizer: str
    trust_remote_code: bool = False
    chat_template_file: str | None = None
    template_kwargs: tuple[tuple[str, object], ...] = ()


_tokenizer = None
_job: TemplateJob | None = None


def _init(job: TemplateJob, in_pool: bool = False) -> None:
    global _tokenizer, _job
    if in_pool:
        # Ctrl-C is the parent's to handle (it says what was kept), not each child's to print a
        # KeyboardInterrupt traceback for; the parent's shutdown ends the children.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # One process per core already: the Rust tokenizer's own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _job = job
    if _tokenizer is None:  # forked children inherit the parent's, already loaded
        _tokenizer = load_tokenizer(
            job.tokenizer, trust_remote_code=job.trust_remote_code, chat_template_file=job.chat_template_file
        )


def template_chunk(conversations: list[tuple]) -> list[list[int] | str]:
    """Ids for each (messages, tools, kwargs) entry, or the template's error message for it;
    kwargs not None replace the job's (a `--variants` entry's on top of the campaign's)."""
    assert _tokenizer is not None and _job is not None
    default_kwargs = dict(_job.template_kwargs)

    def kwargs_of(i: int) -> dict:
        return conversations[i][2] if conversations[i][2] is not None else default_kwargs

    def group_key(i: int) -> str:
        tools = conversations[i][1]
        return (json.dumps(tools, sort_keys=True) if tools else "") + "|" + json.dumps(kwargs_of(i), sort_keys=True)

    out: list[list[int] | str] = [""] * len(conversations)
    indexed = sorted(range(len(conversations)), key=group_key)
    for _, group in groupby(indexed, key=group_key):
        members = list(group)
        tools = conversations[members[0]][1]
        kwargs = kwargs_of(members[0])
        try:
            ids = render_prompt_ids_batch(
                _tokenizer, [conversations[i][0] for i in members], tools=tools, template_kwargs=kwargs
            )
            for i, row_ids in zip(members, ids):
                out[i] = row_ids
        except TemplateError:
            for i in members:
                try:
                    out[i] = render_prompt_ids(_tokenizer, conversations[i][0], tools=tools, template_kwargs=kwargs)
                except TemplateError as exc:
                    out[i] = str(exc)
    return out


class TemplatingPool:
    """Templates chunks in order, `processes` at a time (default: every core; 1 = in this process)."""

    def __init__(self, job: TemplateJob, *, processes: int | None = None, tokenizer=None) -> None:
        global _tokenizer
        self.processes = processes or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None
        # Forking after loading saves each process loading the tokenizer again (seconds for a
        # large vocabulary); where fork is unavailable, each process loads its own.
        _tokenizer = tokenizer
        if self.processes > 1:
            context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            if context.get_start_method() != "fork":
                _tokenizer = None
            self._pool = ProcessPoolExecutor(
                max_workers=self.processes, initializer=_init, initargs=(job, True), mp_context=context
            )
        else:
            _init(job)

    def map(self, chunks: Iterable[tuple[_Context, list]]) -> Iterator[tuple[_Context, list[list[int] | str]]]:
        """For each (context, conversations) chunk, yield (context, results) in input order."""
        if self._pool is None:
            for context, conversations in chunks:
                yield context, template_chunk(conversations)
            return
        window: list[tuple[_Context, Future]] = []
        ahead = self.processes * CHUNKS_AHEAD_PER_PROCESS
        for context, conversations in chunks:
            window.append((context, self._pool.submit(template_chunk, conversations)))
            if len(window) >= ahead:
                context0, future = window.pop(0)
                yield context0, future.result()
        for context0, future in window:
            yield context0, future.result()

    def close(self, *, abort: bool = False) -> None:
        """Shut the pool down; `abort` (Ctrl-C, an error): without waiting for the chunks being
        templated, whose results no one reads (waiting made Ctrl-C take seconds to act)."""
        pool = self._pool
        self._pool = None
        if pool is None:
            return
        if abort:
            # ProcessPoolExecutor has no public way to stop running work before Python 3.14's
            # terminate_workers(); its process table is the one handle on them.
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
