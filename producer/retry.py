"""Put prompts back on the queue: failed ones (`retry-failed`) and ones whose records were
damaged (`repair`)."""

from __future__ import annotations

from celery import Celery

from eagle_synth.payload import DEFAULT_BATCH_SIZE, PromptItem
from eagle_synth.sampling import SamplingParams
from eagle_synth.state.campaign import Campaign
from producer.publisher import Publisher


def _by_sampling(pairs: list[tuple[dict, PromptItem]]) -> list[tuple[dict, list[PromptItem]]]:
    """Group prompts by the sampling parameters they were sent with, so every batch is replayed
    exactly as it was first enqueued."""
    groups: dict[str, tuple[dict, list[PromptItem]]] = {}
    for sampling, item in pairs:
        groups.setdefault(repr(sorted(sampling.items())), (sampling, []))[1].append(item)
    return list(groups.values())


# Batches taken off `failed` and queued per step: one round trip takes this many batches' keys,
# while a step's prompts (2k tokens each) stay a few MB in memory.
RETRY_STEP_BATCHES = 16


def _without_seed(sampling: dict) -> dict:
    """A failure's sampling as its batch had it: the per-sample seed travels with the item."""
    return {k: v for k, v in sampling.items() if k != "sampling_seed"}


def retry_failed(
    campaign: Campaign, *, app: Celery, queue: str, reason: str | None = None, batch_size: int | None = None
) -> int:
    """Enqueue again the failed prompts (of one reason, or all); returns how many.

    Failures are read in HSCAN steps and queued in batches of `batch_size` (default: the
    campaign's own, else DEFAULT_BATCH_SIZE), each item keeping its seed and variant overrides,
    all with the campaign's sampling parameters; one Publisher per sampling (one for a campaign
    with settings), closed at the end. Failures without prompt ids (`record-damaged`: `repair`
    could not read the prompt back) stay: a rerun of the campaign's original `enqueue` command
    replays those.
    """
    from eagle_synth.state.campaign_archive import reopen_if_closed

    reopen_if_closed(campaign)  # a closed campaign's failures come back from its state file
    settings = campaign.settings()
    size = batch_size or (settings.batch_size if settings and settings.batch_size else DEFAULT_BATCH_SIZE)
    base = SamplingParams.from_dict(settings.sampling).for_server() if settings is not None else None
    publishers: dict[str, Publisher] = {}
    waiting: dict[str, list[PromptItem]] = {}
    total = 0
    try:
        for _, failure in campaign.iter_failures():
            if (reason is not None and failure.reason != reason) or not failure.item.get("ids"):
                continue
            sampling = base if base is not None else _without_seed(failure.sampling)
            group = repr(sorted(sampling.items()))
            if group not in publishers:
                publishers[group] = Publisher(
                    campaign=campaign, app=app, queue=queue, sampling=sampling, batch_size=size
                )
            items = waiting.setdefault(group, [])
            items.append(PromptItem.from_replay(failure.item))
            if len(items) >= size * RETRY_STEP_BATCHES:
                total += publishers[group].retry(items)
                items.clear()
        for group, items in waiting.items():
            total += publishers[group].retry(items)
    finally:
        for publisher in publishers.values():
            publisher.close()
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
