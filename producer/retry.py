"""Put prompts back on the queue: failed ones (`retry-failed`) and ones whose records were
damaged (`repair`)."""

from __future__ import annotations

from celery import Celery

from eagle_synth.campaign import Campaign
from eagle_synth.payload import DEFAULT_BATCH_SIZE, PromptItem
from eagle_synth.sampling import SamplingParams
from producer.publisher import Publisher


def _by_sampling(pairs: list[tuple[dict, PromptItem]]) -> list[tuple[dict, list[PromptItem]]]:
    """Group prompts by the sampling parameters they were sent with, so every batch is replayed
    exactly as it was first enqueued."""
    groups: dict[str, tuple[dict, list[PromptItem]]] = {}
    for sampling, item in pairs:
        groups.setdefault(repr(sorted(sampling.items())), (sampling, []))[1].append(item)
    return list(groups.values())


def retry_failed(
    campaign: Campaign, *, app: Celery, queue: str, reason: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE
) -> int:
    """Enqueue again the failed prompts (of one reason, or all); returns how many.

    Failures without prompt ids (`record-damaged`: `repair` could not read the prompt back)
    stay: a rerun of the campaign's original `enqueue` command replays those.
    """
    pairs = [
        (failure.sampling, PromptItem.from_replay(failure.item))
        for failure in campaign.failures().values()
        if (reason is None or failure.reason == reason) and failure.item.get("ids")
    ]
    total = 0
    for sampling, items in _by_sampling(pairs):
        publisher = Publisher(campaign=campaign, app=app, queue=queue, sampling=sampling, batch_size=batch_size)
        publisher.republish(items)
        total += len(items)
    return total


def return_lost_records(
    campaign: Campaign,
    pairs: list[tuple[dict, PromptItem]],
    *,
    app: Celery,
    queue: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> int:
    """Queue again done prompts whose record file was damaged, given (sampling, item) pairs
    read back intact by `repair`; returns how many left `done`."""
    total = 0
    for sampling, items in _by_sampling(pairs):
        publisher = Publisher(campaign=campaign, app=app, queue=queue, sampling=sampling, batch_size=batch_size)
        total += publisher.return_done(items)
        publisher.close()
    return total


def publish_unfinished(campaign: Campaign, *, app: Celery, queue: str) -> int:
    """Publish what a killed enqueue, retry or repair left in the campaign's outbox (every
    batch of a campaign is sent with the campaign's sampling parameters)."""
    settings = campaign.settings()
    if settings is None:
        return 0
    sampling = SamplingParams.from_dict(settings.sampling).for_server()
    publisher = Publisher(campaign=campaign, app=app, queue=queue, sampling=sampling, batch_size=DEFAULT_BATCH_SIZE)
    try:
        return publisher.recover()
    finally:
        publisher.close()
