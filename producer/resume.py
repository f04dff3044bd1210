"""Resume without re-templating (docs/producer.md): once a chunk of rows is claimed, the last
line read per input file is kept with the campaign, and a rerun counts the rows up to it as
duplicates before templating them (the costly step: 188 CPU-s for 500k rows).

A cursor's field names the run's scope (a hash of what decides a row's prompts) and the file's
path, size and mtime, so a changed file, other options, stdin or a dataset folder get none. A
campaign with `record-damaged` failures is never resumed by cursor: those prompts come back
only when a rerun templates their rows again.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from eagle_synth.input_rows import SourceRows
from eagle_synth.state.keys import CampaignKeys

# Suffix of the field beside a cursor that holds the skips, by reason, of the rows up to it.
SKIPPED_SUFFIX = "|skipped"


def run_scope(settings_json: str, **options: object) -> str:
    """A short hash of what maps a row to its prompts: the campaign's settings (without the
    fields that change nothing) and the run's own options (e.g. turns, max_prompt_chars)."""
    settings = json.loads(settings_json)
    for name in ("created_at", "tokenizer_path", "batch_size"):
        settings.pop(name, None)
    material = json.dumps({"settings": settings, "options": options}, sort_keys=True, default=str)
    return hashlib.blake2b(material.encode(), digest_size=8).hexdigest()


@dataclass(eq=False)
class ResumeCursors:
    """The cursors of one enqueue run of `scope` (run_scope); `enabled` False reads and writes none."""

    client: redis.Redis
    keys: CampaignKeys
    scope: str
    enabled: bool
    _fields: dict[str, str | None] = field(default_factory=dict, init=False)
    _starts: dict[str, int] = field(default_factory=dict, init=False)
    _noted: dict[str, int] = field(default_factory=dict, init=False)

    def _field(self, source: str) -> str | None:
        if source not in self._fields:
            path = Path(source)
            try:
                info = path.stat() if source != "-" and path.is_file() else None
            except OSError:
                info = None
            self._fields[source] = (
                None if info is None else f"{self.scope}|{path.resolve()}|{info.st_size}|{info.st_mtime_ns}"
            )
        return self._fields[source]

    def resume_after(self, source: str) -> int:
        """Rows of `source` up to this line were claimed by an earlier run (0: none)."""
        if not self.enabled:
            return 0
        if source not in self._starts:
            field = self._field(source)
            raw = self.client.hget(self.keys.cursors, field) if field else None
            self._starts[source] = int(raw) if raw else 0
        return self._starts[source]

    def skipped_before(self, source: str) -> Counter | None:
        """Skips by reason among the rows up to the cursor of `source`; None when the cursor
        predates them (or there is none)."""
        field = self._field(source) if self.enabled else None
        raw = self.client.hget(self.keys.cursors, field + SKIPPED_SUFFIX) if field else None
        if raw is None:
            return None
        return Counter({str(reason): int(count) for reason, count in json.loads(raw).items()})

    def note(self, reached: dict[str, int], claimed: dict[str, SourceRows]) -> None:
        """Every row up to these lines (per source) is claimed, `claimed` counting them: keep
        both for reruns (in one write, so the line and its skips never disagree)."""
        if not self.enabled:
            return
        updates: dict = {}  # field -> line, and field|skipped -> skips by reason
        for source, line in reached.items():
            field = self._field(source)
            if field and line > self._noted.get(source, 0):
                updates[field] = str(line)
                skipped = claimed[source].skipped_by_reason if source in claimed else {}
                updates[field + SKIPPED_SUFFIX] = json.dumps(dict(skipped))
                self._noted[source] = line
        if updates:
            self.client.hset(self.keys.cursors, mapping=updates)
