"""`eagle-synth inspect`: one record as a person reads it: prompt and output decoded with special
tokens visible and highlighted, the boundary marked with the ids on each side, finish and lengths.
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from eagle_synth.errors import InspectError
from eagle_synth.records import Record, iter_records

# Style of special and added tokens (<|im_end|>, <think>, ...) in decoded text.
SPECIAL_STYLE = "bold magenta"
# Style of the prompt/output boundary marker.
BOUNDARY_STYLE = "bold yellow"
# Ids shown on each side of the boundary.
BOUNDARY_IDS = 8


def render_ids(tokenizer: Any, ids: Sequence[int]) -> Text:
    """Decoded text; runs of ordinary ids decoded together (multi-byte characters stay whole)."""
    # Highlighted: the tokenizer's special tokens and every added token (<think> too).
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    specials.update(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    text = Text()
    run: list[int] = []

    def flush() -> None:
        if run:
            text.append(tokenizer.decode(run, skip_special_tokens=False))
            run.clear()

    size = len(tokenizer)
    for token in ids:
        if token >= size:
            # The model's padded vocabulary (ids past the tokenizer a checkpoint's embedding has):
            # legal output the tokenizer has no text for.
            flush()
            text.append(f"<padded id {token}>", style=SPECIAL_STYLE)
        elif token in specials:
            flush()
            text.append(tokenizer.decode([token], skip_special_tokens=False), style=SPECIAL_STYLE)
        else:
            run.append(token)
    flush()
    return text


def render_record(
    record: Record, *, tokenizer: Any, console: Console | None = None, prompt_tail: int | None = None
) -> None:
    """Print one record: header, [prompt] (its last `prompt_tail` ids if given), boundary, [output], finish."""
    console = console or Console()
    plain = functools.partial(console.print, markup=False, highlight=False)
    console.rule(Text(f"record {record.key}", style="bold"))
    extra = (f"  conversation {record.conversation}" if record.conversation else "") + (
        f"  variant {record.variant}" if record.variant else ""
    )
    plain(
        f"id {record.id}  sample {record.sample}  turn {record.turn}  source {record.source or '-'}  "
        f"batch {record.batch or '-'}{extra}"
    )
    hidden = max(len(record.prompt_ids) - prompt_tail, 0) if prompt_tail is not None else 0
    # Text, not a str: rich would read "[prompt]" as markup.
    shown = f"[prompt] {len(record.prompt_ids)} tokens" + (f" (first {hidden} not shown)" if hidden else "")
    console.rule(Text(shown, style="bold cyan"), align="left")
    console.print(render_ids(tokenizer, record.prompt_ids[hidden:]), highlight=False)
    console.rule(Text("▼ prompt ends, output begins ▼", style=BOUNDARY_STYLE), style=BOUNDARY_STYLE)
    prompt = record.prompt_ids
    output = record.output_ids
    before = ("... " if len(prompt) > BOUNDARY_IDS else "") + " ".join(map(str, prompt[-BOUNDARY_IDS:]))
    after = " ".join(map(str, output[:BOUNDARY_IDS])) + (" ..." if len(output) > BOUNDARY_IDS else "")
    marker = Text.assemble(("prompt ids ", "dim"), before, ("  ┃ output starts ┃  ", BOUNDARY_STYLE), after)
    console.print(marker, highlight=False)
    console.rule(Text(f"[output] {len(record.output_ids)} tokens", style="bold green"), align="left")
    console.print(render_ids(tokenizer, record.output_ids), highlight=False)
    console.rule(style="dim")
    matched = record.finish_matched
    if isinstance(matched, int):
        matched = f"{matched} ({tokenizer.decode([matched], skip_special_tokens=False)!r})"
    plain(
        f"finish {record.finish_reason}  matched {matched if matched is not None else '-'}  "
        f"prompt {len(record.prompt_ids)} (server {record.prompt_tokens})  "
        f"output {len(record.output_ids)} (server {record.completion_tokens})  "
        f"cached {record.cached_tokens}  repaired prefix {record.repaired_prefix}  "
        f"server {record.server or '-'}  latency {_seconds(record.e2e_latency)}"
    )


def _seconds(value: float | None) -> str:
    """A duration as people read it (`0.192 s`), '-' when unknown."""
    return f"{value:.3f} s" if isinstance(value, (int, float)) else "-"


def find_records(
    campaign_path: str | os.PathLike, *, key: str | None = None, random_n: int | None = None, seed: int | None = None
) -> list[Record]:
    """The record whose key starts with `key` (uniquely), or `random_n` drawn uniformly in one
    streaming pass (reservoir sampling: `random_n` records in memory)."""
    if (key is None) == (random_n is None):
        raise InspectError("give a KEY (or a unique prefix of one), or --random N")
    if random_n is not None:
        if random_n < 1:
            raise InspectError("--random must be at least 1")
        rng = random.Random(seed)
        chosen: list[Record] = []
        for seen, record in enumerate(iter_records(Path(campaign_path))):
            if seen < random_n:
                chosen.append(record)
            elif (slot := rng.randrange(seen + 1)) < random_n:
                chosen[slot] = record
        if not chosen:
            raise InspectError(f"{campaign_path} holds no records yet")
        return chosen
    assert key is not None  # exactly one of key and random_n, checked above
    matches: dict[str, Record] = {}
    for record in iter_records(Path(campaign_path)):
        if record.key == key:
            return [record]
        if record.key.startswith(key):
            matches[record.key] = record
    if not matches:
        raise InspectError(f"no record key starts with {key!r} in {campaign_path}")
    if len(matches) > 1:
        shown = ", ".join(sorted(matches)[:5])
        raise InspectError(f"{len(matches)} record keys start with {key!r} ({shown}, ...): give more characters")
    return list(matches.values())
