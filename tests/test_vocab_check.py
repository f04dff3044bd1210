"""The worker's out-of-vocabulary check, called directly: no Celery worker, no server, no Redis."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

from eagle_synth.payload import PromptItem
from workers.batch import _invalid_ids, _Run


def test_ids_outside_the_vocabulary_are_failed_and_never_kept() -> None:
    failed: list[tuple[str, str, str]] = []
    run = SimpleNamespace(fail=lambda item, reason, message: failed.append((item.key, reason, message)))
    items = [
        PromptItem(key="ok", row_id="r0", sample=0, ids=[0, 5, 9]),
        PromptItem(key="high", row_id="r1", sample=0, ids=[1, 10, 2]),
        PromptItem(key="negative", row_id="r2", sample=0, ids=[3, -1]),
        PromptItem(key="empty", row_id="r3", sample=0, ids=[]),
    ]

    kept = _Run.keep(run, items, partial(_invalid_ids, vocab=10))  # type: ignore[arg-type]

    assert [item.key for item in kept] == ["ok"]
    assert failed == [
        ("high", "invalid-token-id", "id 10 is outside the vocabulary (size 10); never sent"),
        ("negative", "invalid-token-id", "id -1 is outside the vocabulary (size 10); never sent"),
        ("empty", "empty-prompt", "the prompt has no ids"),
    ]
