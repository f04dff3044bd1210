"""A campaign's end: `close` folds its Redis state into DIR/NAME/STATE_FILE once it is complete
and every record is under DIR/NAME/records, freeing its key sets but its settings, counters and
`ended` marker; `enqueue` and `retry-failed` read the file back first (`reopen`). The file is one
zstd frame of a msgpack stream: a header map, chunks ["done", [key, ...]], ["failed", [[key,
stored failure], ...]], ["ends", [[conversation, end JSON], ...]], then ["end", counts] when whole.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Any

import msgpack
import zstandard

from eagle_synth.errors import CampaignNotClosable, StateFileUnavailable
from eagle_synth.records import atomic_writer, campaign_dir, read_raw_file, scan_campaign
from eagle_synth.state.campaign import LAYOUT, Campaign
from eagle_synth.state.lua import LuaScript
from eagle_synth.state.redis_client import text

# The folded state's file name inside the campaign folder.
STATE_FILE = "campaign-state.msgpack.zst"
# Version of the file's layout; `reopen` refuses others.
STATE_FORMAT = 1
# Keys per chunk and per Redis round trip: ~0.4 MB of keys.
FOLD_CHUNK = 10_000
# Failures per chunk (~3.7 KB each: near 2 MB; FOLD_CHUNK of them made `close` peak at 204 MiB).
FAILURE_FOLD_CHUNK = 500
# zstd level of the state file: hex keys halve at any level; 3 is the fastest that does.
STATE_ZSTD_LEVEL = 3

_FREE = LuaScript("free")


@dataclass(frozen=True, slots=True)
class CloseSummary:
    """What `close` did: file written, keys folded, Redis's used_memory before and after."""

    path: Path
    done: int
    failed: int
    file_bytes: int
    redis_bytes_before: int
    redis_bytes_after: int


def ended_info(campaign: Campaign) -> dict | None:
    """The campaign's `ended` marker, or None while it is open."""
    raw = campaign.client.get(campaign.keys.ended)
    return json.loads(raw) if raw else None


def _fingerprint(keys: Iterable[str]) -> tuple[int, int]:
    """(count, sum of 128-bit key digests mod 2^128): a set of keys in constant memory."""
    count = 0
    total = 0
    for key in keys:
        count += 1
        total += int.from_bytes(hashlib.blake2b(key.encode(), digest_size=16).digest(), "little")
    return count, total % (1 << 128)


def _record_keys(folder: Path) -> Iterator[str]:
    """The distinct keys of the records under `folder` (only repeated batches' keys are remembered)."""
    files = scan_campaign(folder)
    seen_repeated: set[str] = set()
    for path in files.live:
        for raw in read_raw_file(path):
            if raw.meta.get("batch") in files.repeated_batches:
                if raw.key in seen_repeated:
                    continue
                seen_repeated.add(raw.key)
            yield raw.key


def _queued_batches(campaign: Campaign, queue: str) -> int:
    """Batches of this campaign waiting in the queue or delivered and not yet acked."""
    from eagle_synth.queue import QUEUE_SCAN_STEP, campaign_queues, payload_of_entry, queued_payloads
    from eagle_synth.state.stranded import UNACKED_KEY

    unacked = (payload_of_entry(raw) for _, raw in campaign.client.hscan_iter(UNACKED_KEY, count=QUEUE_SCAN_STEP))
    queued = (
        payload
        for name in campaign_queues(campaign.client, queue, campaign.name)
        for payload in queued_payloads(campaign.client, name)
    )
    payloads = itertools.chain(queued, unacked)
    return sum((payload or {}).get("campaign") == campaign.name for payload in payloads)


def check_closable(campaign: Campaign, folder: Path, *, queue: str) -> None:
    """Raise CampaignNotClosable unless the campaign is complete and its records are all in `folder`."""
    name = campaign.name
    k = campaign.keys
    client = campaign.client
    if campaign.settings() is None:
        raise CampaignNotClosable(f"campaign {name!r} does not exist in this Redis")
    progress = campaign.progress()
    if progress.pending:
        raise CampaignNotClosable(
            f"campaign {name!r} is not complete: {progress.pending} of {progress.enqueued} prompts are still "
            "pending (queued or being generated); wait until `eagle-synth status` shows none, then close"
        )
    busy = {
        "claimed by an enqueue and not yet published": client.hlen(k.outbox),
        "follow-up turns still to generate": client.hlen(k.followups) + client.hlen(k.followup_batches),
    }
    for what, count in busy.items():
        if int(count):
            raise CampaignNotClosable(f"campaign {name!r} is not complete: {count} entries {what}")
    if queued := _queued_batches(campaign, queue):
        raise CampaignNotClosable(
            f"campaign {name!r} still has {queued} batches in the queue (repeats of finished prompts): "
            "let the workers drain them, then close"
        )
    if not (folder / "records").is_dir():
        if progress.done:
            raise CampaignNotClosable(
                f"{folder} holds no records folder, but {progress.done} prompts of {name!r} are done: run close "
                "where the workers' output is (--out), after gathering every worker host's records there"
            )
        return
    want = _fingerprint(text(key) for key in client.sscan_iter(k.done, count=FOLD_CHUNK))
    have = _fingerprint(_record_keys(folder))
    if want != have:
        raise CampaignNotClosable(
            f"the records under {folder / 'records'} are not the campaign's done prompts: Redis has {want[0]} done, "
            f"the folder has {have[0]} distinct records{'' if want[0] != have[0] else ' (other keys)'}. If workers "
            "wrote to several hosts, gather each host's records folder here (file names never collide) and close "
            "again; if records are damaged, run `eagle-synth repair` first"
        )


def _write_state(campaign: Campaign, out: IO[bytes]) -> tuple[int, int, int]:
    """Write the state stream to `out`; returns (done, failed, ends) written."""
    client = campaign.client
    k = campaign.keys
    settings = campaign.settings()
    header = {
        "format": STATE_FORMAT,
        "campaign": campaign.name,
        "settings": settings.to_json() if settings else None,
        "counters": campaign.progress().counters,
        "skipped": campaign.skipped(),
        "failed_reasons": campaign.failure_counts(),
        "closed_at": time.time(),
        "host": socket.gethostname(),
    }
    packer = msgpack.Packer(use_bin_type=True)
    writer = zstandard.ZstdCompressor(level=STATE_ZSTD_LEVEL).stream_writer(out, closefd=False)
    writer.write(packer.pack(header))
    kinds = {
        "done": (FOLD_CHUNK, (text(key) for key in client.sscan_iter(k.done, count=FOLD_CHUNK))),
        "failed": (
            FAILURE_FOLD_CHUNK,
            ((text(key), bytes(raw)) for key, raw in client.hscan_iter(k.failed, count=FAILURE_FOLD_CHUNK)),
        ),
        "ends": (FOLD_CHUNK, ((text(c), text(e)) for c, e in client.hscan_iter(k.conversation_ends, count=FOLD_CHUNK))),
    }
    counts = dict.fromkeys(kinds, 0)
    for kind, (size, values) in kinds.items():
        while chunk := list(islice(values, size)):
            writer.write(packer.pack([kind, chunk]))
            counts[kind] += len(chunk)
    writer.write(packer.pack(["end", counts]))
    writer.flush(zstandard.FLUSH_FRAME)
    return counts["done"], counts["failed"], counts["ends"]


def _used_memory(campaign: Campaign) -> int:
    return int(campaign.client.info("memory").get("used_memory", 0))


def close_campaign(campaign: Campaign, out: str | os.PathLike, *, queue: str) -> CloseSummary:
    """Check, write the file (fsynced, renamed), then in one script check nothing changed, set
    `ended` and free the sets: a kill leaves the campaign open and whole or ended with its file."""
    folder = campaign_dir(out, campaign.name)
    if (info := ended_info(campaign)) is not None:
        raise CampaignNotClosable(f"campaign {campaign.name!r} is already closed (into {info['path']})")
    check_closable(campaign, folder, queue=queue)
    path = folder / STATE_FILE
    with atomic_writer(path) as handle:
        done, failed, _ = _write_state(campaign, handle)
    before = _used_memory(campaign)
    k = campaign.keys
    marker = json.dumps(
        {"path": str(path.resolve()), "host": socket.gethostname(), "at": time.time(), "done": done, "failed": failed}
    )
    names = [k.enqueued, k.done, k.failed, k.ended, k.outbox, k.events, k.conversation_ends, k.followups]
    names += [k.followup_batches, k.batches, k.claims]
    # Layout 2: `enqueued` holds the failed keys only, the done ones left it.
    if not int(_FREE(campaign.client, names, (failed, done, failed, marker))):
        raise CampaignNotClosable(
            f"campaign {campaign.name!r} changed while it was being closed (an enqueue or retry ran): "
            "nothing was freed; close again once it is complete"
        )
    return CloseSummary(path, done, failed, path.stat().st_size, before, _used_memory(campaign))


def _read_state(path: Path) -> Iterator[Any]:
    with open(path, "rb") as handle:
        yield from msgpack.Unpacker(
            zstandard.ZstdDecompressor().stream_reader(handle), raw=False, max_buffer_size=1 << 30
        )


def reopen_campaign(campaign: Campaign, path: str | os.PathLike) -> tuple[int, int]:
    """Read a state file back into Redis, then remove `ended` (only once read whole; rerunnable
    after a kill); returns (done, failed) restored."""
    client = campaign.client
    k = campaign.keys
    stream = _read_state(Path(path))
    header = next(stream, None)
    if not isinstance(header, dict) or header.get("format") != STATE_FORMAT:
        raise StateFileUnavailable(f"{path}: not a campaign state file of format {STATE_FORMAT}")
    if header.get("campaign") != campaign.name:
        raise StateFileUnavailable(f"{path}: holds campaign {header.get('campaign')!r}, not {campaign.name!r}")
    counts = {"done": 0, "failed": 0, "ends": 0}
    whole = None
    for kind, chunk in stream:
        if kind == "end":
            whole = chunk
            break
        pipe = client.pipeline(transaction=False)
        if kind == "done":
            pipe.sadd(k.done, *chunk)
        elif kind == "failed":
            pipe.sadd(k.enqueued, *(key for key, _ in chunk))
            pipe.hset(k.failed, mapping=dict(chunk))
        elif kind == "ends":
            pipe.hset(k.conversation_ends, mapping=dict(chunk))
        pipe.execute()
        counts[kind] += len(chunk)
    if whole != counts:
        raise StateFileUnavailable(f"{path}: the file is cut short (read {counts}, it says {whole})")
    client.set(k.layout, LAYOUT)
    client.delete(k.ended)
    return counts["done"], counts["failed"]


def reopen_if_closed(campaign: Campaign) -> tuple[int, int] | None:
    """Read a closed campaign's state back: (done, failed), None if open, else StateFileUnavailable."""
    info = ended_info(campaign)
    if info is None:
        return None
    path = Path(info["path"])
    if not path.is_file():
        raise StateFileUnavailable(
            f"campaign {campaign.name!r} was closed into {path} on host {info.get('host')!r}, which is not "
            f"readable here: run this on that host, or copy the file to that path, or run "
            f"`eagle-synth reopen {campaign.name} --state FILE` with the copy"
        )
    return reopen_campaign(campaign, path)
