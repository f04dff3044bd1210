"""`eagle-synth repair`: move damaged record files aside and give their prompts back to the queue.

Lost keys are done keys with no readable record in the folder. The done set is read before the
files (workers write, then mark done), so a done key's file is found unless damaged or elsewhere.
A damaged file is read as far as it goes; a record from it is trusted only if its prompt ids and
sampling hash to its own key, which proves the prompt intact: such prompts go straight back on the
queue (`producer.retry.return_lost_records`). The others become `record-damaged` failures, which
a rerun of the campaign's original `enqueue` templates and enqueues again. A folder missing more
keys than its damaged files can have held does not hold the whole campaign (each host keeping its
own records): repair refuses it unless `force`. Damaged files go to `<campaign>/damaged/`, never
deleted; a rerun reads them again, so a repair stopped half way is finished by rerunning it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import zstandard

from eagle_synth.errors import CampaignNotFound, RecordFormatError
from eagle_synth.ids import pack_ids
from eagle_synth.payload import PromptItem, prompt_key
from eagle_synth.reasons import RECORD_DAMAGED
from eagle_synth.records import (
    FORMAT_NAME,
    READABLE_VERSIONS,
    RECORD_SUFFIX,
    Record,
    fsync_dir,
    read_manifest,
    read_raw_file,
    record_from_wire,
    records_dir,
    scan_campaign,
)
from eagle_synth.state.campaign import Campaign, Failure

# Folder (inside the campaign folder, beside records/) that damaged files are moved into.
DAMAGED_DIR = "damaged"
# Compressed bytes fed per step when reading a damaged file, so the part before the damage
# comes out instead of failing with the step that holds it.
SALVAGE_STEP = 4096
# Lost keys a folder may have per record its damaged files can have held (estimated from the
# healthy files' bytes per record) before repair decides the folder is not the whole campaign.
MISSING_ALLOWANCE = 2.0


@dataclass(slots=True)
class DamagedFile:
    """A record file that does not read back: where it is now, the reader's message, its bytes, the
    records salvaged from it (their key proves the prompt intact), and whether it is in damaged/ already."""

    path: Path
    error: str
    size: int
    salvaged: int = 0
    moved_before: bool = False


@dataclass(slots=True)
class RepairPlan:
    """What a repair finds and would do (the module docstring's terms): `done` keys when it started,
    `recoverable` (sampling, item) of lost keys read back intact, `unrecoverable` lost keys, the
    records the damaged files can have held (`capacity`, None without a healthy file to estimate
    from), and why it will not act without force (`refusal`)."""

    campaign: str
    folder: Path
    damaged: list[DamagedFile] = field(default_factory=list)
    healthy_files: int = 0
    healthy_records: int = 0
    done: int = 0
    lost: list[str] = field(default_factory=list)
    recoverable: list[tuple[dict, PromptItem]] = field(default_factory=list)
    unrecoverable: list[str] = field(default_factory=list)
    capacity: float | None = None
    refusal: str | None = None

    def to_dict(self) -> dict:
        return {
            "campaign": self.campaign,
            "folder": str(self.folder),
            "damaged": [
                {"file": str(d.path), **{k: v for k, v in dataclasses.asdict(d).items() if k != "path"}}
                for d in self.damaged
            ],
            "healthy_files": self.healthy_files,
            "healthy_records": self.healthy_records,
            "done": self.done,
            **{name: len(getattr(self, name)) for name in ("lost", "recoverable", "unrecoverable")},
            "capacity": None if self.capacity is None else round(self.capacity, 1),
            "refusal": self.refusal,
        }


def _decompressed_until_damage(path: str | os.PathLike) -> Iterator[bytes]:
    """A zstd file's content up to where it breaks. A failing step loses its output, so after a
    failure the file is decoded again, that step one byte at a time, to get all before the damage."""
    with open(path, "rb") as handle:
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        offset = 0  # bytes fed before the failing step
        with contextlib.suppress(zstandard.ZstdError):
            while chunk := handle.read(SALVAGE_STEP):
                yield decompressor.decompress(chunk)
                offset += len(chunk)
                if decompressor.eof:
                    return
            return  # truncated: everything there came out
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        handle.seek(0)
        remaining = offset
        while remaining:  # replays what was already yielded, to rebuild the decoder's state
            chunk = handle.read(min(SALVAGE_STEP, remaining))
            remaining -= len(chunk)
            decompressor.decompress(chunk)
        for value in handle.read(SALVAGE_STEP):
            try:
                yield decompressor.decompress(bytes([value]))
            except zstandard.ZstdError:
                return


def salvage_records(path: str | os.PathLike) -> Iterator[Record]:
    """Stream the records of a damaged file up to its damage (any may be garbled: check keys)."""
    unpacker = msgpack.Unpacker(raw=False)
    header: dict | None = None
    try:
        for data in _decompressed_until_damage(path):
            unpacker.feed(data)
            for value in unpacker:
                if header is None:
                    if not isinstance(value, dict) or value.get("format") != FORMAT_NAME:
                        return
                    if (header := value).get("version") not in READABLE_VERSIONS:
                        return
                elif isinstance(value, dict):
                    try:
                        yield record_from_wire(value, header)
                    except (KeyError, TypeError, ValueError):
                        continue  # one garbled record; the key check judges the others
    except (zstandard.ZstdError, msgpack.UnpackException, ValueError, KeyError, TypeError, OSError):
        return  # the damage: what came before it is all there is


def _intact(record: Record, key_sampling: dict) -> bool:
    """True if the record's prompt ids, sampling and sample index hash to its key."""
    try:
        key = prompt_key(prompt_ids=pack_ids(record.prompt_ids), sampling=key_sampling, sample=record.sample)
    except (TypeError, ValueError, OverflowError):
        return False
    return key == record.key


def _replay_item(record: Record) -> tuple[dict, PromptItem]:
    sampling = dict(record.sampling or {})
    seed = sampling.pop("sampling_seed", None)
    return sampling, PromptItem(
        key=record.key,
        row_id=str(record.id),
        sample=record.sample,
        ids=list(record.prompt_ids),
        seed=seed,
        source=record.source,
        turn=record.turn,
    )


def plan_repair(campaign_path: str | os.PathLike, campaign: Campaign, *, force: bool = False) -> RepairPlan:
    """Find damaged files and lost keys; changes nothing. Hold compact.exclusive(records folder)
    from before this call until the plan is applied, so no record moves meanwhile."""
    folder = Path(campaign_path)
    settings = campaign.settings()
    if settings is None:
        raise CampaignNotFound(campaign.name)
    plan = RepairPlan(campaign=campaign.name, folder=folder)
    # Done first, files second: see the module docstring.
    done = campaign.done_keys()
    plan.done = len(done)
    scan = scan_campaign(folder)
    healthy: set[str] = set()
    healthy_bytes = 0

    def tally(path: Path) -> bool:
        """Count a file's keys as healthy, or the file as damaged (False); a vanished file is neither."""
        nonlocal healthy_bytes
        try:
            # Keys of a damaged file's readable part are not healthy: the whole file is moved aside.
            keys = [raw.key for raw in read_raw_file(path)]
            size = path.stat().st_size
        except RecordFormatError as exc:
            plan.damaged.append(DamagedFile(path=path, error=str(exc), size=path.stat().st_size))
            return False
        except FileNotFoundError:
            return True
        healthy.update(keys)
        plan.healthy_records += len(keys)
        plan.healthy_files += 1
        healthy_bytes += size
        return True

    damaged_shards = {path for path in scan.live if not tally(path) and path in scan.shard_sources}
    # Batch files a damaged shard absorbed but that are still here hold its records again.
    still_listed = {
        name for shard, names in scan.shard_sources.items() if shard not in damaged_shards for name in names
    }
    for path in scan.absorbed:
        if path.name not in still_listed:
            tally(path)
    for path in sorted((folder / DAMAGED_DIR).glob(f"*{RECORD_SUFFIX}")):
        moved = DamagedFile(path, "moved aside by an earlier repair", path.stat().st_size, moved_before=True)
        plan.damaged.append(moved)

    lost = done - healthy
    plan.lost = sorted(lost)
    key_sampling = {k: v for k, v in settings.sampling.items() if k != "n"}
    recovered: dict[str, tuple[dict, PromptItem]] = {}
    for damaged in plan.damaged:
        for record in salvage_records(damaged.path):
            if record.key in lost and record.key not in recovered and _intact(record, key_sampling):
                recovered[record.key] = _replay_item(record)
                damaged.salvaged += 1
    plan.recoverable = [recovered[key] for key in plan.lost if key in recovered]
    plan.unrecoverable = [key for key in plan.lost if key not in recovered]

    if plan.healthy_records:
        plan.capacity = sum(d.size for d in plan.damaged) / (healthy_bytes / plan.healthy_records)
    if not force and len(plan.unrecoverable) > MISSING_ALLOWANCE * (plan.capacity or 0.0):
        held = "nothing to estimate from" if plan.capacity is None else f"about {plan.capacity:.0f}"
        plan.refusal = (
            f"{len(plan.unrecoverable)} done keys have no readable record in {folder}, more than its "
            f"{len(plan.damaged)} damaged files can have held ({held}): the folder does not seem to hold "
            "the whole campaign. Gather every host's records/ into one folder first (docs/operations.md "
            "§6), or pass --force if those records really are gone"
        )
    return plan


def move_aside(plan: RepairPlan) -> list[Path]:
    """Move the plan's live damaged files into <campaign>/damaged/; returns their new paths."""
    target = plan.folder / DAMAGED_DIR
    moved = []
    for damaged in plan.damaged:
        if damaged.moved_before:
            continue
        target.mkdir(exist_ok=True)
        destination = target / damaged.path.name
        if destination.exists():
            destination = target / f"{damaged.path.stem}-{time.time_ns():x}{RECORD_SUFFIX}"
        os.replace(damaged.path, destination)
        damaged.path = destination
        moved.append(destination)
    if moved:
        fsync_dir(target)
        fsync_dir(records_dir(plan.folder))
    return moved


def mark_record_damaged(campaign: Campaign, keys: list[str], *, worker: str = "eagle-synth repair") -> int:
    """Move done keys whose prompt could not be read back to failed (`record-damaged`, no prompt
    ids: a rerun of the original `enqueue` replays them, `retry-failed` cannot); returns how many."""
    message = (
        "its record file was damaged and its prompt could not be read back; rerun the campaign's "
        "original `eagle-synth enqueue` command to enqueue it again"
    )

    def failure(key: str) -> Failure:
        item = PromptItem(key=key, row_id="", sample=0, ids=[]).to_replay()
        return Failure(RECORD_DAMAGED, message, item, sampling={}, at=time.time(), worker=worker)

    return campaign.fail_done((key, failure(key)) for key in keys)


def campaign_name_of(campaign_path: str | os.PathLike) -> str:
    """The campaign a folder belongs to: manifest.json's name, else the folder's name."""
    try:
        name = (read_manifest(campaign_path) or {}).get("campaign")
    except (OSError, ValueError):
        name = None
    return str(name or Path(campaign_path).resolve().name)
