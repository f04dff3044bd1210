"""A campaign's failed prompts grouped by reason (`eagle-synth failed`).

`failures_by_reason` returns one JSON-ready dict; its keys are the contract of
`eagle-synth failed --json`: {"campaign", "failed", "by_reason": {reason: {"count", "prompts"}}},
each prompt {"key", "id", "source", "message", "at", "worker"}, reasons in order of first key.
"""

from __future__ import annotations

from eagle_synth.campaign import Campaign

# Characters of a failure message shown per example line; the JSON keeps it whole.
MESSAGE_PREVIEW_CHARS = 200


def failures_by_reason(campaign: Campaign, *, examples: int = 5) -> dict:
    """The campaign's current failures, grouped by reason, prompts sorted by key; for
    `--history own` campaigns also the conversations that stopped early, by reason (with up to
    `examples` of each)."""
    from eagle_synth.conversation_store import ConversationStore

    failures = campaign.failures()
    settings = campaign.settings()
    stopped = ConversationStore(campaign).stopped(examples=examples) if settings and settings.history == "own" else {}
    by_reason: dict[str, list[dict]] = {}
    for key, failure in sorted(failures.items()):
        by_reason.setdefault(failure.reason, []).append(
            {
                "key": key,
                "id": failure.item.get("row_id"),
                "source": failure.item.get("source"),
                "message": failure.message,
                "at": failure.at,
                "worker": failure.worker,
            }
        )
    return {
        "campaign": campaign.name,
        "failed": len(failures),
        "by_reason": {reason: {"count": len(prompts), "prompts": prompts} for reason, prompts in by_reason.items()},
        "conversations_stopped": stopped,
    }


def format_failures(report: dict, *, limit: int) -> list[str]:
    """The lines `eagle-synth failed` prints: a total, then each reason (most first) with up to
    `limit` examples."""
    lines = [f"{report['failed']} failed prompts in {report['campaign']}"]
    for reason, group in sorted(report["by_reason"].items(), key=lambda kv: -kv[1]["count"]):
        lines.append(f"  {reason}: {group['count']}")
        lines.extend(
            f"    {p['key']} ({p['source']}): {p['message'][:MESSAGE_PREVIEW_CHARS]}" for p in group["prompts"][:limit]
        )
    stopped = report.get("conversations_stopped") or {}
    if stopped:
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
