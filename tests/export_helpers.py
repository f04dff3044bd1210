"""Record folders for export and vocab tests, written with the project's own writer (no workers needed)."""

from __future__ import annotations

import random
from pathlib import Path

from eagle_synth.records import Record, iter_records, write_record_file

IM_START, THINK, IM_END = 248045, 248068, 248046


def conversation_records(
    conversations: int, *, turns: int = 3, samples: int = 2, seed: int = 0, truncated_every: int = 7
) -> list[Record]:
    """Records of `conversations` input rows, each with `turns` user turns and `samples` samples.

    Prompts grow with the turn (the history); outputs draw ids from a skewed distribution so
    token counts have a clear head and many ties in the tail. Some records stopped on a
    (non-ASCII) stop string, so finish_matched mixes ints and strings as real campaigns do.
    """
    rng = random.Random(seed)
    records = []
    n = 0
    for row in range(conversations):
        for sample in range(samples):
            for turn in range(turns):
                prompt = [IM_START, 846, 198] + [rng.randrange(1000, 1100) for _ in range(3 + 4 * turn)] + [THINK, 198]
                length = rng.randrange(1, 12)
                output = [int(rng.paretovariate(1.2)) + 100 for _ in range(length)]
                truncated = n % truncated_every == truncated_every - 1
                output.append(7 if truncated else IM_END)
                records.append(
                    Record(
                        key=f"{n:032x}",
                        id=f"row{row}",
                        sample=sample,
                        turn=turn,
                        prompt_ids=prompt,
                        output_ids=output,
                        finish_reason="length" if truncated else "stop",
                        finish_matched=None if truncated else ("停止" if n % 5 == 0 else IM_END),
                        prompt_tokens=len(prompt),
                        completion_tokens=len(output),
                        campaign="camp",
                        sampling={"temperature": 0.6, "sampling_seed": n},
                        source=f"in.jsonl:{row + 1}",
                        server="http://gpu1:30000",
                        worker="w1",
                        e2e_latency=0.5,
                        created_at=1.7e9 + n,
                    )
                )
                n += 1
    return records


def plain_record(
    key: str,
    id: str,
    prompt: list[int],
    output: list[int],
    *,
    finish_reason: str = "stop",
    finish_matched: int | None = None,
) -> Record:
    """A single-turn, first-sample record whose token counts are its ids'."""
    return Record(
        key=key,
        id=id,
        sample=0,
        turn=0,
        prompt_ids=prompt,
        output_ids=output,
        finish_reason=finish_reason,
        finish_matched=finish_matched,
        prompt_tokens=len(prompt),
        completion_tokens=len(output),
    )


def write_campaign(folder: Path, records: list[Record], *, per_file: int = 16) -> Path:
    """Write records as batch files of `per_file` records; returns the campaign folder."""
    for start in range(0, len(records), per_file):
        write_record_file(folder, campaign="camp", batch=f"{start:016x}", records=records[start : start + per_file])
    return folder


def by_key(folder: Path) -> dict[str, Record]:
    """The campaign's records as iter_records reads them, by key."""
    return {record.key: record for record in iter_records(folder)}


def torch_format_stand_in(monkeypatch) -> None:
    """Let `datasets` apply the torch format a speculators folder's state.json names where torch
    is not installed: NumPy arrays stand in for tensors (they have the `.tolist()` speculators
    calls on rows, train/data.py:83 at c05b95b). With torch installed, the real format is used."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        from datasets import formatting
        from datasets.formatting.np_formatter import NumpyFormatter

        monkeypatch.setitem(formatting._FORMAT_TYPES, "torch", NumpyFormatter)
