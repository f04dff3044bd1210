"""A campaign folder's manifest.json: what made its records, and how many there are."""

from __future__ import annotations

import time

import msgspec

from eagle_synth.records import FORMAT_NAME, FORMAT_VERSION, ID_CODEC
from eagle_synth.state.campaign import Campaign


def build_manifest(campaign: Campaign) -> dict:
    """Settings (tokenizer fingerprint, template hash, sampling), servers, counts."""
    settings = campaign.settings()
    progress = campaign.progress()
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "id_codec": ID_CODEC,
        "campaign": campaign.name,
        "settings": msgspec.structs.asdict(settings) if settings else None,
        "servers": campaign.servers(),
        "counts": {"enqueued": progress.enqueued, "done": progress.done, "failed": progress.failed},
        "updated_at": time.time(),
    }
