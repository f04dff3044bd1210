"""`eagle-synth verify`: check a campaign's records against its tokenizer and settings.

Every check is in CHECKS (errors make the exit nonzero); the report also gives finish reasons, the
share truncated by length, and the reasoning structure (prompts that end inside an open think
block, and outputs that close it).
"""

from __future__ import annotations

import os
from array import array
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eagle_synth.errors import RecordFormatError, TemplateError, VerifyError
from eagle_synth.model_identity import model_vocab_size, output_id_bound
from eagle_synth.records import RawRecord, read_manifest, read_raw_file, scan_campaign
from eagle_synth.templating import THINK_CLOSE, THINK_OPEN, eos_token_ids, read_tokenizer, token_id, tokenizer_facts
from eagle_synth.tokenizer_files import folder_problem
from eagle_synth.tools.filters import hash64

# Keys (or files) kept as examples per check in the report.
EXAMPLES_PER_CHECK = 5
# Every check, its severity and what it means; the report always lists all of them.
CHECKS: dict[str, tuple[str, str]] = {
    "damaged_file": (
        "error",
        "record files that cannot be read (truncated, corrupt or of a newer format); "
        "`eagle-synth repair DIR` moves them aside and requeues their prompts",
    ),
    "duplicate_key": ("error", "keys stored more than once"),
    "id_out_of_vocab": (
        "error",
        "records with a prompt id at or above the tokenizer's size, or an output id at or above the model's vocab_size",
    ),
    "completion_tokens_mismatch": ("error", "records whose completion_tokens differs from the number of output ids"),
    "stop_without_eos": ("warning", "finish_reason stop, but the last output id is neither EOS nor a stop id"),
    "empty_output": ("warning", "records with no output ids"),
    "stripped_reasoning": (
        "warning",
        "prompts open a think block but no output that stopped closes it: "
        "the signature of reasoning tokens stripped from the output",
    ),
    "tokenizer_mismatch": ("warning", "the tokenizer given is not the one the campaign was made with"),
    "conversation_gap": (
        "error",
        "conversations (--history own) whose turns are not 0..n-1: a turn is missing below one that exists",
    ),
}


@dataclass(frozen=True, slots=True)
class CheckSettings:
    """What records are checked against: prompt ids below `vocab_size` (len(tokenizer)), output ids
    below output_bound (`model_vocab_size` None: any), a `stop` ending on an EOS or stop id (each
    record's sampling adds its own); `source`: "tokenizer", "manifest" or "tokenizer+manifest";
    `fingerprint_mismatch`: a note when the tokenizer differs from the manifest's."""

    vocab_size: int
    eos_token_ids: frozenset[int]
    stop_token_ids: frozenset[int] = frozenset()
    think_open_id: int | None = None
    think_close_id: int | None = None
    source: str = "tokenizer"
    fingerprint_mismatch: str | None = None
    model_vocab_size: int | None = None

    @property
    def output_bound(self) -> int:
        """Output ids are legal below this (the worker's rule: eagle_synth/model_identity.py)."""
        return output_id_bound(tokenizer_size=self.vocab_size, model_vocab=self.model_vocab_size)

    def to_dict(self) -> dict:
        return {
            "vocab_size": self.vocab_size,
            "model_vocab_size": self.model_vocab_size,
            "eos_token_ids": sorted(self.eos_token_ids),
            "stop_token_ids": sorted(self.stop_token_ids),
            "think_open_id": self.think_open_id,
            "think_close_id": self.think_close_id,
            "from": self.source,
        }


def load_plain_tokenizer(path: str | os.PathLike, *, manifest: dict | None = None):
    """A tokenizer for reading ids (no chat template needed); TemplateError says what went wrong.

    A campaign made with --trust-remote-code (its settings record `tokenizer_files`) is read with
    the folder's own tokenizer code, only when the folder holds exactly those files (the code
    trusted at enqueue); otherwise TemplateError names the file that differs."""
    expected = ((manifest or {}).get("settings") or {}).get("tokenizer_files") or {}
    if expected and (problem := folder_problem(path, expected)):
        raise TemplateError(f"--tokenizer: {problem}; pass the folder the campaign was enqueued with")
    return read_tokenizer(path, hint="the one the campaign was enqueued with", trust_remote_code=bool(expected))


def check_settings(*, tokenizer: Any = None, manifest: dict | None = None) -> CheckSettings:
    """Settings from the tokenizer (preferred for ids) and the manifest (stop ids, fingerprint)."""
    stored = (manifest or {}).get("settings") or {}
    stops = frozenset(int(i) for i in (stored.get("sampling") or {}).get("stop_token_ids") or ())
    if tokenizer is None:
        if not stored.get("vocab_size"):
            raise VerifyError(
                "no vocabulary size to check ids against: this campaign folder has no manifest.json "
                "with settings; pass --tokenizer with the campaign's tokenizer"
            )
        return CheckSettings(
            vocab_size=int(stored["vocab_size"]),
            eos_token_ids=frozenset(stored.get("eos_token_ids") or ()),
            stop_token_ids=stops,
            think_open_id=stored.get("think_open_id"),
            think_close_id=stored.get("think_close_id"),
            source="manifest",
            model_vocab_size=stored.get("model_vocab_size"),
        )
    mismatch = None
    if stored.get("tokenizer_fingerprint"):
        # Hashing the vocabulary takes about a second: only when there is a fingerprint to compare.
        fingerprint = tokenizer_facts(tokenizer).fingerprint
        if fingerprint != stored["tokenizer_fingerprint"]:
            mismatch = (
                f"tokenizer fingerprint {fingerprint} differs from the campaign's "
                f"{stored['tokenizer_fingerprint']} ({stored.get('tokenizer_path', '?')})"
            )
    return CheckSettings(
        vocab_size=len(tokenizer),
        eos_token_ids=frozenset(eos_token_ids(tokenizer) + list(stored.get("eos_token_ids") or ())),
        stop_token_ids=stops,
        think_open_id=token_id(tokenizer, THINK_OPEN),
        think_close_id=token_id(tokenizer, THINK_CLOSE),
        source="tokenizer+manifest" if stored else "tokenizer",
        fingerprint_mismatch=mismatch,
        model_vocab_size=stored.get("model_vocab_size") or model_vocab_size(getattr(tokenizer, "name_or_path", "")),
    )


def _rfind_id(data: bytes, needle: bytes) -> int:
    """Index of the last occurrence of one id in uint32 bytes, -1 if absent."""
    end = len(data)
    while True:
        pos = data.rfind(needle, 0, end)
        if pos < 0 or pos % 4 == 0:
            return pos // 4 if pos >= 0 else -1
        end = pos + 3  # matched across two ids: look further left


class _Checker:
    """Runs the per-record checks and keeps the figures (`reasoning`: _report's names); one pass."""

    def __init__(self, settings: CheckSettings) -> None:
        self.settings = settings
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.records = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.finish: Counter[str] = Counter()
        self.backends: Counter[str] = Counter()
        self.reasoning: Counter[str] = Counter()
        self.key_hashes = array("Q")
        # Conversation key -> bit mask of the turns seen (a few dozen bytes per conversation).
        self.conversations: dict[str, int] = {}
        self._open, self._close = (
            None if token is None else token.to_bytes(4, "little")
            for token in (settings.think_open_id, settings.think_close_id)
        )

    def hit(self, check: str, example: str, amount: int = 1) -> None:
        self.counts[check] += amount
        kept = self.examples.setdefault(check, [])
        if len(kept) < EXAMPLES_PER_CHECK:
            kept.append(example)

    def check(self, raw: RawRecord) -> None:
        s = self.settings
        meta = raw.meta
        key = raw.key
        self.records += 1
        self.prompt_tokens += raw.prompt_len
        self.output_tokens += raw.output_len
        finish = meta.get("finish_reason", "")
        self.finish[finish] += 1
        # Files written before vLLM support hold SGLang records only (Record.backend's default).
        self.backends[meta.get("backend") or "sglang"] += 1
        self.key_hashes.append(hash64(key))
        prompt, output = array("I", raw.prompt_u32), array("I", raw.output_u32)
        if max(prompt, default=0) >= s.vocab_size or max(output, default=0) >= s.output_bound:
            self.hit("id_out_of_vocab", key)
        if meta.get("completion_tokens") != raw.output_len:
            self.hit("completion_tokens_mismatch", key)
        if not output:
            self.hit("empty_output", key)
        if finish == "stop" and not isinstance(meta.get("finish_matched"), str):
            # A stop on a stop *string* may end mid-text; only token stops must end on their id.
            own = frozenset((meta.get("sampling") or {}).get("stop_token_ids") or ())
            if not output or output[-1] not in s.eos_token_ids | s.stop_token_ids | own:
                self.hit("stop_without_eos", key)
        if self._open is not None and self._close is not None:
            opened = _rfind_id(raw.prompt_u32, self._open)
            if opened >= 0 and opened > _rfind_id(raw.prompt_u32, self._close):
                closes = int(_rfind_id(raw.output_u32, self._close) >= 0)
                self.reasoning.update(prompts_open_think=1, closed_in_output=closes)
                if finish == "stop":
                    self.reasoning.update(stopped_open_think=1, stopped_closed_in_output=closes)
            self.reasoning["outputs_opening_think"] += _rfind_id(raw.output_u32, self._open) >= 0
        if conversation := meta.get("conversation"):
            self.conversations[conversation] = self.conversations.get(conversation, 0) | (1 << int(meta.get("turn", 0)))


def _duplicates(checker: _Checker, files: list[Path]) -> dict[str, list[str]]:
    """Repeated keys and the files holding them; a second pass runs only if a hash repeats."""
    hashes, counts = np.unique(np.frombuffer(checker.key_hashes, dtype=np.uint64), return_counts=True)
    if not (wanted := set(hashes[counts > 1].tolist())):
        return {}
    places: dict[str, list[str]] = {}
    for path in files:
        try:
            for raw in read_raw_file(path):
                if hash64(raw.key) in wanted:
                    places.setdefault(raw.key, []).append(path.name)
        except (RecordFormatError, FileNotFoundError):  # damaged: reported; gone: compacted since the scan
            continue
    return {key: names for key, names in places.items() if len(names) > 1}


def verify_campaign(campaign_path: str | os.PathLike, *, tokenizer: Any = None) -> dict:
    """Check every record of a campaign folder (OUT/<campaign>) against `tokenizer` (loaded, a folder,
    or None: manifest.json's settings); returns the report (stable keys, JSON-ready)."""
    campaign_path = Path(campaign_path)
    manifest = read_manifest(campaign_path)
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = load_plain_tokenizer(tokenizer, manifest=manifest)
    settings = check_settings(tokenizer=tokenizer, manifest=manifest)
    scan = scan_campaign(campaign_path)
    checker = _Checker(settings)
    damaged: list[dict] = []
    for path in scan.live:
        try:
            for raw in read_raw_file(path):
                checker.check(raw)
        except RecordFormatError as exc:
            damaged.append({"file": path.name, "error": str(exc)})
            checker.hit("damaged_file", path.name)
        except FileNotFoundError:
            continue  # compacted away since the scan: its records are in a shard read later or next run
    for key, names in sorted(_duplicates(checker, scan.live).items()):
        checker.hit("duplicate_key", f"{key} ({', '.join(names)})")
    for conversation, turns in checker.conversations.items():
        if turns != (1 << turns.bit_length()) - 1:
            present = [t for t in range(turns.bit_length()) if turns >> t & 1]
            checker.hit("conversation_gap", f"{conversation}: turns {present}")
    if settings.fingerprint_mismatch:
        checker.hit("tokenizer_mismatch", settings.fingerprint_mismatch)
    stopped = checker.reasoning["stopped_open_think"]
    if stopped and not checker.reasoning["stopped_closed_in_output"]:
        checker.hit("stripped_reasoning", f"{stopped} stopped records open a think block; none closes it", stopped)
    return _report(campaign_path, scan, settings, checker, damaged, manifest)


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def _report(
    campaign_path: Path, scan, settings: CheckSettings, c: _Checker, damaged: list[dict], manifest: dict | None
) -> dict:
    r = c.reasoning
    checks = {
        name: {
            "severity": severity,
            "count": int(c.counts[name]),
            "examples": c.examples.get(name, []),
            "message": message,
        }
        for name, (severity, message) in CHECKS.items()
    }
    found = Counter(check["severity"] for check in checks.values() if check["count"])
    return {
        "campaign": str(campaign_path),
        "ok": found["error"] == 0,
        "errors": found["error"],
        "warnings": found["warning"],
        "format_version": (manifest or {}).get("format_version"),
        "files": {
            "batch_files": len(scan.batch_files),
            "shards": len(scan.shards),
            "compaction_leftovers": len(scan.absorbed),
            "damaged": len(damaged),
        },
        "records": c.records,
        "tokens": {"prompt": c.prompt_tokens, "output": c.output_tokens},
        "finish_reasons": dict(sorted(c.finish.items())),
        "backends": dict(sorted(c.backends.items())),
        "truncated_share": _share(c.finish.get("length", 0), c.records),
        "reasoning": {
            "prompts_open_think": r["prompts_open_think"],
            "closed_in_output": r["closed_in_output"],
            "closed_share": _share(r["closed_in_output"], r["prompts_open_think"]),
            "stopped_open_think": r["stopped_open_think"],
            "stopped_closed_in_output": r["stopped_closed_in_output"],
            "outputs_opening_think": r["outputs_opening_think"],
        },
        "conversations": {
            "count": len(c.conversations),
            "turns": sum(bin(turns).count("1") for turns in c.conversations.values()),
            "longest": max((turns.bit_length() for turns in c.conversations.values()), default=0),
        },
        "settings": settings.to_dict(),
        "checks": checks,
        "damaged": damaged,
    }


def format_report(report: dict) -> list[tuple[str, str | None]]:
    """The human summary as (line, rich style) pairs."""
    lines: list[tuple[str, str | None]] = []

    def say(line: str, style: str | None = None) -> None:
        lines.append((line, style))

    files = report["files"]
    tokens = report["tokens"]
    s = report["settings"]
    say(
        f"{report['campaign']}: {report['records']} records, {tokens['prompt']} prompt + {tokens['output']} output "
        f"tokens in {files['batch_files']} batch files and {files['shards']} shards",
        "bold",
    )
    say(
        f"checked against vocab {s['vocab_size']} (outputs: model vocab_size {s.get('model_vocab_size') or 'unknown'}), "
        f"EOS {s['eos_token_ids']}, stop ids {s['stop_token_ids']} (from {s['from']})"
    )
    finish = ", ".join(f"{k} {v}" for k, v in report["finish_reasons"].items()) or "none"
    truncated = report["truncated_share"]
    say(f"finish reasons: {finish}; truncated by length: {'-' if truncated is None else f'{100 * truncated:.1f}%'}")
    say(f"generated by: {', '.join(f'{k} {v}' for k, v in report['backends'].items()) or 'none'}")
    r = report["reasoning"]
    if r["prompts_open_think"]:
        say(
            f"reasoning: {r['prompts_open_think']} prompts end in an open think block; "
            f"{r['closed_in_output']} outputs close it ({100 * (r['closed_share'] or 0):.1f}%)"
        )
    else:
        say("reasoning: no prompt ends in an open think block")
    conv = report["conversations"]
    if conv["count"]:
        say(f"conversations: {conv['count']} with {conv['turns']} turns (longest {conv['longest']})")
    if files["compaction_leftovers"]:
        say(
            f"{files['compaction_leftovers']} batch files already in a shard (a stopped compact); "
            "readers skip them, `eagle-synth compact` deletes them"
        )
    for name, check in report["checks"].items():
        if check["count"]:
            style = "red" if check["severity"] == "error" else "yellow"
            say(f"{check['severity'].upper()} {name}: {check['count']} - {check['message']}", style)
            for example in check["examples"]:
                say(f"    {example}", style)
    verdict = "OK: no hard errors" if report["ok"] else f"FAILED: {report['errors']} kinds of hard error"
    if report["warnings"]:
        verdict += f", {report['warnings']} kinds of warning"
    say(verdict, "bold green" if report["ok"] else "bold red")
    return lines
