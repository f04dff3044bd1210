"""A campaign's failed prompts grouped by reason (`eagle-synth failed`).

`failures_by_reason` returns one JSON-ready dict; its keys are the contract of
`eagle-synth failed --json`: {"campaign", "failed", "by_reason": {reason: {"count", "prompts"}}},
each prompt {"key", "id", "source", "message", "at", "worker"}, reasons in order of first key.
"""

from __future__ import annotations

from eagle_synth.campaign import Campaign

# Characters of a failure message shown per example line; the JSON keeps it whole.
MESSAGE_PREVIEW_CHARS = 200


def failures_by_reason(campaign: Campaign) -> dict:
    """The campaign's current failures, grouped by reason, prompts sorted by key."""
    failures = campaign.failures()
    by_reason: dict[str, list[dict]] = {}
    for key, failure in sorted(failures.items()):
        by_reason.setdefault(failure.reason, []).append({
            "key": key, "id": failure.item.get("row_id"), "source": failure.item.get("source"),
            "message": failure.message, "at": failure.at, "worker": failure.worker,
        })
    return {"campaign": campaign.name, "failed": len(failures),
            "by_reason": {reason: {"count": len(prompts), "prompts": prompts} for reason, prompts in by_reason.items()}}


def format_failures(report: dict, *, limit: int) -> list[str]:
    """The lines `eagle-synth failed` prints: a total, then each reason (most first) with up to
    `limit` examples."""
    lines = [f"{report['failed']} failed prompts in {report['campaign']}"]
    for reason, group in sorted(report["by_reason"].items(), key=lambda kv: -kv[1]["count"]):
        lines.append(f"  {reason}: {group['count']}")
        lines.extend(f"    {p['key']} ({p['source']}): {p['message'][:MESSAGE_PREVIEW_CHARS]}"
                     for p in group["prompts"][:limit])
    return lines
