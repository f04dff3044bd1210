"""`eagle-synth retry-failed`: put failed prompts back on the queue."""

from __future__ import annotations

from celery import Celery

from eagle_synth.campaign import Campaign
from eagle_synth.payload import DEFAULT_BATCH_SIZE, PromptItem
from producer.publisher import Publisher


def retry_failed(campaign: Campaign, *, app: Celery, queue: str, reason: str | None = None,
                 batch_size: int = DEFAULT_BATCH_SIZE) -> int:
    """Enqueue again the failed prompts (of one reason, or all); returns how many.

    Failures are grouped by the sampling parameters they were sent with, so every batch
    is replayed exactly as it was first enqueued.
    """
    groups: dict[str, tuple[dict, list[PromptItem]]] = {}
    for failure in campaign.failures().values():
        if reason is not None and failure.reason != reason:
            continue
        group_key = repr(sorted(failure.sampling.items()))
        groups.setdefault(group_key, (failure.sampling, []))[1].append(PromptItem.from_replay(failure.item))
    total = 0
    for sampling, items in groups.values():
        publisher = Publisher(campaign=campaign, app=app, queue=queue, sampling=sampling, batch_size=batch_size)
        publisher.republish(items)
        total += len(items)
    return total
