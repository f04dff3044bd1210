"""Put prompts back on the queue: failed ones (`retry-failed`) and ones whose records were
damaged (`repair`). Every batch is replayed with the sampling parameters it was first sent with."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from celery import Celery

from eagle_synth.payload import DEFAULT_BATCH_SIZE, PromptItem
from eagle_synth.sampling import ServerSampling
from eagle_synth.state.campaign import Campaign
from producer.publisher import Publisher

# Batches taken off `failed` and queued per step: one round trip takes this many batches' keys,
# while a step's prompts (2k tokens each) stay a few MB in memory.
RETRY_STEP_BATCHES = 16


@contextmanager
def _publishers(
    campaign: Campaign, app: Celery, queue: str, batch_size: int
) -> Iterator[Callable[[ServerSampling], Publisher]]:
    """The Publisher of each sampling of a campaign (made on first use), closed together at the end."""
    made: dict[ServerSampling, Publisher] = {}

    def of(sampling: ServerSampling) -> Publisher:
        if sampling not in made:
            made[sampling] = Publisher(
                campaign=campaign, app=app, queue=queue, sampling=sampling, batch_size=batch_size
            )
        return made[sampling]

    try:
        yield of
    finally:
        for publisher in made.values():
            publisher.close()


def retry_failed(campaign: Campaign, *, app: Celery, queue: str, reason: str | None = None) -> int:
    """Enqueue again the failed prompts (of one reason, or all) in batches of the campaign's size,
    each keeping its seed and variant, with the campaign's sampling (else the failure's own);
    returns how many. `record-damaged` failures hold no ids: enqueue replays them."""
    from eagle_synth.state.campaign_archive import reopen_if_closed

    reopen_if_closed(campaign)  # a closed campaign's failures come back from its state file
    settings = campaign.settings()
    size = settings.batch_size if settings and settings.batch_size else DEFAULT_BATCH_SIZE
    base = settings.sampling_params().server() if settings is not None else None
    waiting: dict[Publisher, list[PromptItem]] = {}
    total = 0
    with _publishers(campaign, app, queue, size) as publisher_of:
        for _, failure in campaign.iter_failures():
            if (reason is not None and failure.reason != reason) or not failure.item.get("ids"):
                continue
            own = ServerSampling(failure.sampling).without_seed()
            publisher = publisher_of(base if base is not None else own)
            items = waiting.setdefault(publisher, [])
            items.append(PromptItem(**failure.item))
            if len(items) >= size * RETRY_STEP_BATCHES:
                total += publisher.retry(items)
                items.clear()
        return total + sum(publisher.retry(items) for publisher, items in waiting.items())


def return_lost_records(campaign: Campaign, pairs: list[tuple[dict, PromptItem]], *, app: Celery, queue: str) -> int:
    """Queue again done prompts whose record file was damaged, given (sampling, item) pairs
    read back intact by `repair`; returns how many left `done`."""
    groups: dict[Publisher, list[PromptItem]] = {}
    with _publishers(campaign, app, queue, DEFAULT_BATCH_SIZE) as publisher_of:
        for sampling, item in pairs:
            groups.setdefault(publisher_of(ServerSampling(sampling)), []).append(item)
        return sum(publisher.return_done(items) for publisher, items in groups.items())


def publish_unfinished(campaign: Campaign, *, app: Celery, queue: str) -> int:
    """Publish what a killed enqueue, retry or repair left in the campaign's outbox (every
    batch of a campaign is sent with the campaign's sampling parameters)."""
    settings = campaign.settings()
    if settings is None:
        return 0
    with _publishers(campaign, app, queue, DEFAULT_BATCH_SIZE) as publisher_of:
        return publisher_of(settings.sampling_params().server()).recover()
