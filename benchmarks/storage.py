"""Storage benchmark: bytes per token on disk, and read/export speed, on real Qwen3.5 token ids.

Records are synthesised from real text (this Python's standard library: its source as code,
its docstrings as prose) tokenized with the Qwen3.5 tokenizer and wrapped in its chat
template, with the shapes a reasoning model produces (prompt ending in `<think>\\n`, output
closing it and ending in `<|im_end|>`, some truncated). Text is consumed without reuse, so no
record repeats another and compression is not flattered.

    python -m benchmarks.storage            # full: ~1.5M tokens
    python -m benchmarks.storage --quick    # ~250k tokens, a few seconds

The tokenizer is $EAGLE_SYNTH_BENCH_TOKENIZER, else the tests' Qwen3.5 (benchmarks.common.bench_tokenizer).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import os
import random
import sysconfig
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import msgpack
import zstandard

from eagle_synth.ids import pack_ids, unpack_ids
from eagle_synth.records import (
    RECORD_ZSTD_LEVEL,
    SHARD_ZSTD_LEVEL,
    Record,
    ids_as_u32le,
    iter_raw_records,
    iter_records,
    write_record_file,
)

# Tokens of text to draw records from: quick and full runs.
QUICK_TOKENS = 250_000
FULL_TOKENS = 1_600_000
# Records per batch file: the producer's default --batch-size.
BATCH_RECORDS = 16
# Gzip level of the JSONL baseline (gzip's own default).
GZIP_LEVEL = 6
# Prompt and output lengths (tokens): lognormal, clipped, like chat prompts and reasoning answers.
PROMPT_LEN = (5.0, 1.0, 20, 1500)
OUTPUT_LEN = (6.3, 0.8, 100, 2000)
# Share of outputs cut by max_new_tokens.
TRUNCATED_SHARE = 0.08
# Share of prompts with a system prompt.
SYSTEM_SHARE = 0.5


def _texts(limit_chars: int) -> list[str]:
    """Code (stdlib sources) and prose (their long docstrings), interleaved, up to limit_chars."""
    texts: list[str] = []
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        texts.append(source)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    texts.append(doc)
        total = sum(map(len, texts))
        if total >= limit_chars:
            break
    return texts


def synth_records(tokenizer, *, tokens: int, seed: int = 0) -> list[Record]:
    """Realistic records totalling about `tokens` ids; see the module docstring."""
    rng = random.Random(seed)
    texts = _texts(limit_chars=tokens * 4)
    streams = [ids for ids in tokenizer(texts, add_special_tokens=False)["input_ids"] if len(ids) > 300]
    rng.shuffle(streams)
    pool = [i for ids in streams for i in ids]
    cursor = 0

    def take(count: int) -> list[int]:
        nonlocal cursor
        cursor += count
        if cursor > len(pool):
            raise StopIteration
        return pool[cursor - count : cursor]

    marker = tokenizer.convert_tokens_to_ids("X")
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "X"}], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    cut = rendered.index(marker)
    before, after = rendered[:cut], rendered[cut + 1 :]
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    system_header = [im_start] + tokenizer("system", add_special_tokens=False)["input_ids"] + newline
    systems = [
        system_header + tokenizer(text, add_special_tokens=False)["input_ids"] + [im_end] + newline
        for text in ("You are a helpful assistant.", "You are a careful senior engineer. Answer precisely.")
    ]
    think_close = tokenizer.convert_tokens_to_ids("</think>")
    blank = tokenizer("\n\n", add_special_tokens=False)["input_ids"]

    def length(spec) -> int:
        mu, sigma, low, high = spec
        return int(min(high, max(low, rng.lognormvariate(mu, sigma))))

    records = []
    try:
        while cursor < tokens:
            n = len(records)
            prompt = (
                (rng.choice(systems) if rng.random() < SYSTEM_SHARE else []) + before + take(length(PROMPT_LEN)) + after
            )
            size = length(OUTPUT_LEN)
            if rng.random() < TRUNCATED_SHARE:
                finish, output = "length", take(size)
            else:
                thinking = rng.randrange(size // 4, size * 3 // 4)
                finish, output = "stop", take(thinking) + [think_close] + blank + take(size - thinking) + [im_end]
            records.append(
                Record(
                    key=hashlib.blake2b(f"{seed}:{n}".encode(), digest_size=16).hexdigest(),
                    id=f"row-{n}",
                    sample=0,
                    turn=0,
                    prompt_ids=prompt,
                    output_ids=output,
                    finish_reason=finish,
                    finish_matched=im_end if finish == "stop" else None,
                    prompt_tokens=len(prompt),
                    completion_tokens=len(output),
                    cached_tokens=rng.choice([0, len(prompt) // 2]),
                    campaign="bench",
                    sampling={
                        "max_new_tokens": 2048,
                        "temperature": 0.6,
                        "top_p": 0.95,
                        "sampling_seed": rng.randrange(2**31),
                    },
                    source=f"data/train.jsonl:{n + 1}",
                    server="http://10.0.0.7:30000",
                    worker="eagle-synth-ab12@gpu3",
                    e2e_latency=round(rng.uniform(1, 60), 3),
                    created_at=1.7e9 + n,
                )
            )
    except StopIteration:
        pass
    return records


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _jsonl_gzip(records: list[Record]) -> bytes:
    lines = "".join(json.dumps(asdict(r), separators=(",", ":")) + "\n" for r in records)
    return gzip.compress(lines.encode(), compresslevel=GZIP_LEVEL)


def _msgpack_zstd(records: list[Record], encode, level: int) -> int:
    """Bytes of the records as msgpack maps with ids in `encode`, in one zstd frame."""
    packer = msgpack.Packer(use_bin_type=True)
    parts = []
    for record in records:
        data = asdict(record)
        data["prompt_ids"], data["output_ids"] = encode(record.prompt_ids), encode(record.output_ids)
        parts.append(packer.pack(data))
    return len(zstandard.ZstdCompressor(level=level).compress(b"".join(parts)))


def _shuffled(ids: list[int]) -> bytes:
    raw = pack_ids(ids)
    return raw[0::4] + raw[1::4] + raw[2::4] + raw[3::4]


def _varint(ids: list[int]) -> bytes:
    out = bytearray()
    for value in ids:
        while value >= 0x80:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
    return bytes(out)


def _unvarint(data: bytes) -> list[int]:
    ids, value, shift = [], 0, 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
        else:
            ids.append(value)
            value, shift = 0, 0
    return ids


def _u24(ids: list[int]) -> bytes:
    raw = bytearray(pack_ids(ids))
    del raw[3::4]
    return bytes(raw)


def _row(figure: str, ours: float, baseline: str, value: float, unit: str) -> dict:
    return {
        "figure": figure,
        "ours": round(ours, 4),
        "baseline": baseline,
        "baseline_value": round(value, 4),
        "ratio": round(ours / value, 4) if value else None,
        "unit": unit,
    }


def _best_rate(tokens: int, run, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return tokens / best


def run(quick: bool) -> list[dict]:
    """Measure; returns one row per figure (ours vs a baseline, with the ratio)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    from benchmarks.common import bench_tokenizer
    from eagle_synth.tools.compact import compact
    from eagle_synth.tools.export import export_records

    tokenizer = AutoTokenizer.from_pretrained(str(bench_tokenizer()))
    records = synth_records(tokenizer, tokens=QUICK_TOKENS if quick else FULL_TOKENS)
    tokens = sum(len(r.prompt_ids) + len(r.output_ids) for r in records)
    batches = [records[i : i + BATCH_RECORDS] for i in range(0, len(records), BATCH_RECORDS)]
    rows: list[dict] = []
    repeats = 1 if quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        campaign = Path(tmp) / "bench"
        for index, batch in enumerate(batches):
            write_record_file(campaign, campaign="bench", batch=f"{index:016x}", records=batch)
        folder = campaign / "records"
        batch_bytes = _folder_bytes(folder)
        batch_gzip = sum(len(_jsonl_gzip(batch)) for batch in batches)
        batch_v1 = sum(_msgpack_zstd(batch, pack_ids, RECORD_ZSTD_LEVEL) for batch in batches)
        rows.append(
            _row(
                "bytes/token, batch files",
                batch_bytes / tokens,
                "JSONL+gzip, same batches",
                batch_gzip / tokens,
                "B/token",
            )
        )
        rows.append(
            _row(
                "bytes/token, batch files",
                batch_bytes / tokens,
                "format v1 (u32le, zstd-9)",
                batch_v1 / tokens,
                "B/token",
            )
        )

        read_rate = _best_rate(tokens, lambda: sum(len(r.prompt_ids) for r in iter_records(campaign)), repeats)

        compact(campaign, min_age=0)
        shard_bytes = _folder_bytes(folder)
        whole_gzip = _jsonl_gzip(records)
        rows.append(
            _row(
                "bytes/token, compacted shard",
                shard_bytes / tokens,
                "JSONL+gzip, one file",
                len(whole_gzip) / tokens,
                "B/token",
            )
        )
        rows.append(
            _row("bytes/token, compacted shard", shard_bytes / tokens, "raw int32 ids (no metadata)", 4.0, "B/token")
        )
        for name, encode in (("u32le", pack_ids), ("byte-shuffled u32", _shuffled), ("LEB128 varint", _varint)):
            other = _msgpack_zstd(records, encode, SHARD_ZSTD_LEVEL)
            ours = _msgpack_zstd(records, _u24, SHARD_ZSTD_LEVEL)
            rows.append(
                _row("bytes/token, id codec at zstd-19", ours / tokens, f"{name} + zstd-19", other / tokens, "B/token")
            )

        sample = [r.output_ids for r in records[:200]]
        sample_tokens = sum(map(len, sample))
        u24_blobs, varint_blobs = [_u24(ids) for ids in sample], [_varint(ids) for ids in sample]
        u24_rate = _best_rate(sample_tokens, lambda: [unpack_ids(ids_as_u32le(b, "u24le")) for b in u24_blobs], repeats)
        varint_rate = _best_rate(sample_tokens, lambda: [_unvarint(b) for b in varint_blobs], repeats)
        rows.append(
            _row("decode tokens/s, u24le ids", u24_rate, "LEB128 varint (pure Python)", varint_rate, "tokens/s")
        )

        gz_path = Path(tmp) / "records.jsonl.gz"
        gz_path.write_bytes(whole_gzip)

        def read_gzip() -> None:
            with gzip.open(gz_path, "rt") as handle:
                for line in handle:
                    json.loads(line)

        gzip_rate = _best_rate(tokens, read_gzip, repeats)
        rows.append(
            _row("read tokens/s, iter_records (lists)", read_rate, "JSONL+gzip json.loads", gzip_rate, "tokens/s")
        )
        raw_rate = _best_rate(tokens, lambda: sum(r.prompt_len for r in iter_raw_records(campaign)), repeats)
        rows.append(
            _row("read tokens/s, iter_raw_records (bytes)", raw_rate, "JSONL+gzip json.loads", gzip_rate, "tokens/s")
        )
        for fmt in ("parquet", "jsonl"):
            export_records(campaign, Path(tmp) / f"out.{fmt}", format=fmt)  # warm-up: imports, caches
            rate = _best_rate(
                tokens, lambda fmt=fmt: export_records(campaign, Path(tmp) / f"out.{fmt}", format=fmt), repeats
            )
            rows.append(_row(f"export tokens/s, {fmt}", rate, "JSONL+gzip json.loads", gzip_rate, "tokens/s"))
    rows.append(
        {
            "figure": "corpus tokens",
            "ours": tokens,
            "baseline": f"{len(records)} records",
            "baseline_value": len(records),
            "ratio": None,
            "unit": "tokens",
        }
    )
    return rows


def print_table(rows: list[dict]) -> None:
    header = ("figure", "ours", "baseline", "baseline value", "ours/baseline")
    lines = [header] + [
        (
            r["figure"],
            f"{r['ours']:,.3f}" if r["ours"] < 100 else f"{r['ours']:,.0f}",
            r["baseline"],
            f"{r['baseline_value']:,.3f}" if r["baseline_value"] < 100 else f"{r['baseline_value']:,.0f}",
            "-" if r["ratio"] is None else f"{r['ratio']:.3f}",
        )
        for r in rows
    ]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    for n, line in enumerate(lines):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)))
        if n == 0:
            print("  ".join("-" * width for width in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="A small corpus: a few seconds.")
    parser.add_argument("--json", action="store_true", help="Print the rows as JSON.")
    args = parser.parse_args()
    rows = run(quick=args.quick)
    if args.json:
        print(json.dumps(rows))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
