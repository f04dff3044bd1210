"""A campaign's failed prompts grouped by reason (`eagle-synth failed`).

`write_failures_json` writes one JSON object, streamed; its keys are the contract of
`eagle-synth failed --json`: {"campaign", "failed", "by_reason": {reason: {"count", "prompts"}},
"conversations_stopped"}, each prompt {"key", "id", "source", "message", "at", "worker"} (in scan
order). `failure_summary` gives the same as a dict with up to `examples` prompts per reason (the
lowest keys): both read failures in HSCAN steps, so `failed` runs in bounded memory at any number
of failures.
"""

from __future__ import annotations

import bisect
import json
import tempfile
from collections import Counter
from contextlib import ExitStack
from typing import IO

from eagle_synth.state.campaign import Campaign, Failure
from eagle_synth.state.campaign_archive import ended_info
from eagle_synth.state.conversation_store import ConversationStore

# Characters of a failure message shown per example line; the JSON keeps it whole.
MESSAGE_PREVIEW_CHARS = 200


def _listed(key: str, failure: Failure) -> dict:
    return {
        "key": key,
        "id": failure.item.get("row_id"),
        "source": failure.item.get("source"),
        "message": failure.message,
        "at": failure.at,
        "worker": failure.worker,
    }


def _stopped(campaign: Campaign, examples: int) -> dict:
    settings = campaign.settings()
    return ConversationStore(campaign).stopped(examples=examples) if settings and settings.history == "own" else {}


def failure_summary(campaign: Campaign, *, examples: int = 5) -> dict:
    """The failures by reason with only each reason's `examples` lowest keys, in bounded memory; `--history
    own`: also the conversations that stopped early, by reason (up to `examples` each)."""
    counts = campaign.failure_counts()  # kept equal to `failed` by every script that changes it
    lowest: dict[str, list[tuple[str, dict]]] = {}  # per reason, the lowest keys so far, sorted
    for key, failure in campaign.iter_failures():
        kept = lowest.setdefault(failure.reason, [])
        if examples and (len(kept) < examples or key < kept[-1][0]) and all(k != key for k, _ in kept):
            bisect.insort(kept, (key, _listed(key, failure)), key=lambda entry: entry[0])
            del kept[examples:]
    return {
        "campaign": campaign.name,
        "failed": sum(counts.values()),
        "by_reason": {
            reason: {"count": counts[reason], "prompts": [p for _, p in lowest.get(reason, [])]} for reason in counts
        },
        "conversations_stopped": _stopped(campaign, examples),
        "ended": ended_info(campaign),
    }


def write_failures_json(campaign: Campaign, out: IO[str], *, examples: int = 5) -> None:
    """Every failure by reason as one JSON object, streamed: prompts spooled per reason, then copied."""
    spools: dict[str, IO[str]] = {}
    counts: Counter[str] = Counter()
    with ExitStack() as opened:
        for key, failure in campaign.iter_failures():
            if failure.reason not in spools:
                spools[failure.reason] = opened.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8"))
            spools[failure.reason].write(json.dumps(_listed(key, failure)) + "\n")
            counts[failure.reason] += 1
        out.write(f'{{"campaign": {json.dumps(campaign.name)}, "failed": {counts.total()}, "by_reason": {{')
        for n, (reason, spool) in enumerate(spools.items()):
            out.write(("" if n == 0 else ", ") + f'{json.dumps(reason)}: {{"count": {counts[reason]}, "prompts": [')
            spool.seek(0)
            for i, line in enumerate(spool):
                out.write(("" if i == 0 else ", ") + line.rstrip("\n"))
            out.write("]}")
        out.write(f'}}, "conversations_stopped": {json.dumps(_stopped(campaign, examples))}}}\n')


def format_failures(report: dict, *, limit: int) -> list[str]:
    """`eagle-synth failed`'s lines: a total, then each reason (most first) with up to `limit` examples."""
    lines = [f"{report['failed']} failed prompts in {report['campaign']}"]
    if ended := report.get("ended"):
        lines.append(
            f"  (closed: {ended['failed']} failures are folded into {ended['path']}; `retry-failed` reads them back)"
        )
    for reason, group in sorted(report["by_reason"].items(), key=lambda kv: -kv[1]["count"]):
        lines.append(f"  {reason}: {group['count']}")
        lines.extend(
            f"    {p['key']} ({p['source']}): {p['message'][:MESSAGE_PREVIEW_CHARS]}" for p in group["prompts"][:limit]
        )
    if stopped := report.get("conversations_stopped"):
        lines.append(
            f"{sum(s['count'] for s in stopped.values())} conversations stopped early (their records are "
            "kept; failed turns above stop theirs too)"
        )
        for reason, info in sorted(stopped.items(), key=lambda kv: -kv[1]["count"]):
            lines.append(f"  {reason}: {info['count']}")
            for end in info["examples"]:
                detail = f": {end['message'][:MESSAGE_PREVIEW_CHARS]}" if end.get("message") else ""
                lines.append(
                    f"    {end['conversation']} ({end['source']}) after {end['turns']} turn{'' if end['turns'] == 1 else 's'}{detail}"
                )
    return lines
