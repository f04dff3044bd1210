"""Sampling and template variants (`enqueue --variants FILE.json`), for diverse training data.

A variants file is a JSON list of entries {"name"?, "weight" > 0, "sampling"?: SamplingParams
overrides, "chat_template_kwargs"?: overrides}; docs/producer.md ("Variants") has an example.
Each conversation (a row, and with `--history own` each of its samples) gets one variant,
picked by a stable hash of what defines it, so a rerun picks the same one. Every record
carries the variant's name; the campaign's settings keep the whole list.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields
from pathlib import Path

import msgspec

from eagle_synth.errors import SamplingError, VariantsError
from eagle_synth.sampling import SamplingParams

# SamplingParams fields a variant may override (n and seed stay the campaign's).
OVERRIDABLE_SAMPLING = tuple(f.name for f in fields(SamplingParams) if f.name not in ("n", "seed"))
# Keys a variant entry may have.
VARIANT_KEYS = frozenset({"name", "weight", "sampling", "chat_template_kwargs"})


class Variant(msgspec.Struct, frozen=True):
    """One way to sample and template a conversation.

    Parameters:
        name: recorded on every record made with it.
        weight: relative share of conversations.
        sampling: SamplingParams field overrides.
        chat_template_kwargs: chat template argument overrides.
    """

    name: str
    weight: float
    sampling: dict = msgspec.field(default_factory=dict)
    chat_template_kwargs: dict = msgspec.field(default_factory=dict)

    def to_dict(self) -> dict:
        return msgspec.structs.asdict(self)

    def sampling_params(self, base: SamplingParams) -> SamplingParams:
        """The campaign's sampling with this variant's overrides."""
        return SamplingParams.from_dict({**base.to_dict(), **self.sampling})

    def server_overrides(self, base: SamplingParams) -> dict:
        """The `sampling_params` entries that differ from the campaign's (what a prompt carries)."""
        mine, theirs = self.sampling_params(base).for_server(), base.for_server()
        return {k: v for k, v in mine.items() if theirs.get(k) != v}


def load_variants(path: str | Path, *, base: SamplingParams) -> list[Variant]:
    """Read and check a variants file against the campaign's sampling; VariantsError says what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise VariantsError(f"--variants {path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise VariantsError(f"--variants {path}: not valid JSON: {exc}") from None
    if not isinstance(data, list) or not data:
        raise VariantsError(f"--variants {path}: expected a non-empty JSON list of variants")
    variants = []
    for index, entry in enumerate(data):
        where = f"--variants {path}: entry {index}"
        if not isinstance(entry, dict):
            raise VariantsError(f"{where}: expected an object with weight, sampling, chat_template_kwargs")
        if unknown := sorted(set(entry) - VARIANT_KEYS):
            raise VariantsError(f"{where}: unknown field(s) {unknown}; known: {sorted(VARIANT_KEYS)}")
        weight = entry.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise VariantsError(f"{where}.weight: expected a number > 0, got {weight!r}")
        name = entry.get("name", f"v{index}")
        if not isinstance(name, str) or not name:
            raise VariantsError(f"{where}.name: expected a non-empty string, got {name!r}")
        sampling = entry.get("sampling") or {}
        kwargs = entry.get("chat_template_kwargs") or {}
        for field, value in (("sampling", sampling), ("chat_template_kwargs", kwargs)):
            if not isinstance(value, dict):
                raise VariantsError(f"{where}.{field}: expected an object, got {type(value).__name__}")
        if bad := sorted(set(sampling) - set(OVERRIDABLE_SAMPLING)):
            raise VariantsError(
                f"{where}.sampling: cannot override {bad}; a variant may set {list(OVERRIDABLE_SAMPLING)}"
            )
        variant = Variant(name=name, weight=float(weight), sampling=dict(sampling), chat_template_kwargs=dict(kwargs))
        try:
            variant.sampling_params(base)
        except (SamplingError, TypeError, ValueError) as exc:
            raise VariantsError(f"{where}.sampling: {exc}") from None
        variants.append(variant)
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise VariantsError(f"--variants {path}: variant names must differ, got {names}")
    return variants


def pick_variant(variants: list[Variant], identity: str) -> Variant | None:
    """The variant of a conversation: a stable hash of its identity, spread by weight."""
    if not variants:
        return None
    digest = hashlib.blake2b(f"variant|{identity}".encode(), digest_size=8).digest()
    # The 64-bit digest as a fraction of 1, scaled to the total weight.
    point = int.from_bytes(digest, "little") / 2**64 * sum(v.weight for v in variants)
    for variant in variants:
        point -= variant.weight
        if point < 0:
            return variant
    return variants[-1]
