"""Sampling parameters: only keys SGLang's `sampling_params` accepts, checked before enqueue.

SGLang fails a whole batch on an unknown key (HTTP 500 before 0.5.23, 400 since) or an out-of-range
value; checking here says so at enqueue time. Every value SGLang would otherwise fill in is sent
(`for_server`): `--preferred-sampling-params` merges UNDER the request's own, so anything left out
could be changed by the server's operator without the records saying so.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import ItemsView, Iterator, KeysView, Mapping
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from eagle_synth.errors import SamplingError
from eagle_synth.flags import Flag

# Keys SGLang's SamplingParams accepts (sglang/srt/sampling/sampling_params.py).
SGLANG_SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "logit_bias",
        "sampling_seed",
        "custom_params",
    }
)
# Largest seed SGLang's sampler takes without overflow.
MAX_SEED = 2**31 - 1
# Values sent although they are SGLang's own defaults (see the module docstring).
NEUTRAL_SERVER_PARAMS = {
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "min_new_tokens": 0,
    "ignore_eos": False,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
    "n": 1,
}


def parse_stop_token_ids(raw: str | None) -> tuple[int, ...]:
    """The ids of --stop-token-ids (comma-separated), or SamplingError naming the first that is not one."""
    parts = [part.strip() for part in (raw or "").split(",") if part.strip()]
    if bad := [part for part in parts if not part.isdigit()]:
        raise SamplingError(
            f"--stop-token-ids: {bad[0]!r} is not a token id; give comma-separated non-negative integers, e.g. 151645,151643"
        )
    return tuple(int(part) for part in parts)


# The flag reads the ids as one comma-separated string.
STOP_TOKEN_IDS_FLAG = Flag(
    "Extra stop ids, comma-separated (EOS always stops).", type=str | None, default=None, parse=parse_stop_token_ids
)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What the server samples with, identical for every prompt of a campaign.

    Parameters:
        max_new_tokens: cap on generated tokens per prompt.
        temperature: 0 is greedy; SGLang treats values below 1e-6 as greedy.
        top_p, top_k, min_p, repetition_penalty: as SGLang defines them (-1 top_k = off).
        stop_token_ids: extra ids that end a generation (EOS always does).
        n: samples per prompt; each sample is its own prompt key and record.
        seed: base of each sample's `sampling_seed`; None derives each sample's seed from its
            prompt key alone (see sample_seed).
    """

    max_new_tokens: Annotated[int, Flag("Cap on generated tokens per prompt.")] = 2048
    temperature: Annotated[float, Flag("Sampling temperature (0 = greedy).")] = 0.6
    top_p: Annotated[float, Flag("Nucleus sampling mass.")] = 0.95
    top_k: Annotated[int, Flag("Top-k sampling (-1 = off).")] = -1
    min_p: Annotated[float, Flag("Min-p sampling.")] = 0.0
    repetition_penalty: Annotated[float, Flag("Repetition penalty (1 = off).")] = 1.0
    stop_token_ids: Annotated[tuple[int, ...], STOP_TOKEN_IDS_FLAG] = field(default_factory=tuple)
    n: Annotated[int, Flag("Samples per prompt; each is its own record.", names=("--n",))] = 1
    seed: Annotated[int | None, Flag("Base seed: each sample gets a stable sampling_seed.")] = None

    def __post_init__(self) -> None:
        checks = (
            (not 1 <= self.max_new_tokens <= 1_000_000, f"--max-new-tokens {self.max_new_tokens}: must be 1..1000000"),
            (not 0.0 <= self.temperature <= 100.0, f"--temperature {self.temperature}: must be 0..100"),
            (not 0.0 < self.top_p <= 1.0, f"--top-p {self.top_p}: must be in (0, 1]"),
            (self.top_k != -1 and self.top_k < 1, f"--top-k {self.top_k}: must be -1 (off) or >= 1"),
            (not 0.0 <= self.min_p <= 1.0, f"--min-p {self.min_p}: must be 0..1"),
            (
                not 0.0 < self.repetition_penalty <= 2.0,
                f"--repetition-penalty {self.repetition_penalty}: must be in (0, 2]",
            ),
            (not 1 <= self.n <= 1024, f"--n {self.n}: must be 1..1024"),
            (self.seed is not None and not 0 <= self.seed <= MAX_SEED, f"--seed {self.seed}: must be 0..{MAX_SEED}"),
            (
                any((not isinstance(t, int)) or t < 0 for t in self.stop_token_ids),
                f"--stop-token-ids {list(self.stop_token_ids)}: ids must be >= 0",
            ),
        )
        if problems := [message for failed, message in checks if failed]:
            raise SamplingError("; ".join(problems))

    def to_dict(self) -> dict:
        """Plain JSON form, stored in the campaign settings and every record."""
        return {**asdict(self), "stop_token_ids": list(self.stop_token_ids)}

    @classmethod
    def from_dict(cls, data: dict) -> SamplingParams:
        return cls(**{**data, "stop_token_ids": tuple(data.get("stop_token_ids") or ())})

    def server(self) -> ServerSampling:
        """for_server() as the typed value a payload carries to the worker's backends."""
        return ServerSampling(self.for_server())

    def for_server(self) -> dict:
        """The `sampling_params` the worker sends and records carry, every value explicit, without
        the per-sample seed (n is 1: each sample is its own prompt, key, record and retry). Prompt
        keys come from to_dict(), which this does not change. Every key is an SGLang one
        (tests/test_sampling_seeds.py checks; the SGLang backend refuses any other)."""
        return {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            # Special tokens only affect `text`, which we never use; ids are kept whole.
            "skip_special_tokens": False,
            "stop_token_ids": list(self.stop_token_ids),
            # No stop strings: generations end on ids only (EOS and stop_token_ids).
            "stop": [],
            **NEUTRAL_SERVER_PARAMS,
        }

    def sample_seed(self, *, prompt_key_material: bytes, sample: int, prompt_key: str) -> int:
        """One sample's `sampling_seed`, never None and stable across reruns: a hash of --seed, the
        prompt ids and the sample index, or without --seed of the prompt key (ids, sampling, sample).
        SGLang honours it only with --enable-deterministic-inference (docs/producer.md)."""
        if self.seed is None:
            material = b"unseeded|" + prompt_key.encode()
        else:
            material = prompt_key_material + f"|{self.seed}|{sample}".encode()
        return int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "little") % MAX_SEED


# The key a sample's own seed is sent under (SGLang's name; backends rename it).
SEED_KEY = "sampling_seed"


class ServerSampling(Mapping[str, Any]):
    """The sampling a prompt is queued with, in SGLang's names: what each backend translates into
    its request (workers/backends/*: translate_sampling) and what records and failures say was
    sent. Read-only; the values the worker acts on are typed properties.

    It keeps the queued map whole, keys in the order they came: that map is part of the payload's
    bytes (tests/test_payload_bytes.py), and a key no server knows must reach the backend that
    refuses it (`bad-sampling-params`), not vanish in decoding.

    Parameters:
        values: the `sampling_params` map (SamplingParams.for_server(), a queued payload's map,
            or a failure's).
    """

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    # The dict's own views and lookups, faster than Mapping's generic ones (every request reads them).
    def __contains__(self, key: object) -> bool:
        return key in self._values

    def keys(self) -> KeysView[str]:
        return self._values.keys()

    def items(self) -> ItemsView[str, Any]:
        return self._values.items()

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def __eq__(self, other: object) -> bool:
        # By `identity`, as __hash__: 1 and 1.0 are different values on the wire.
        if isinstance(other, ServerSampling):
            return self.identity == other.identity
        if isinstance(other, Mapping):
            return self.identity == ServerSampling(other).identity
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.identity)

    def __repr__(self) -> str:
        return f"ServerSampling({self._values!r})"

    @property
    def identity(self) -> str:
        """The same text for the same keys and values, whatever their order: groups batches."""
        return json.dumps(self._values, sort_keys=True, default=repr)

    @property
    def max_new_tokens(self) -> int:
        """Cap on generated tokens (0 when the map has none: the server's default applies)."""
        return int(self._values.get("max_new_tokens") or 0)

    @property
    def seed(self) -> int | None:
        """This sample's `sampling_seed`, None when none is sent."""
        return self._values.get(SEED_KEY)

    def for_sample(self, *, overrides: Mapping[str, Any] | None, seed: int | None) -> ServerSampling:
        """This sampling with a variant's `overrides` on top and the sample's own `seed` (if any)."""
        if seed is None and not overrides:
            return self
        values = {**self._values, **(overrides or {})}
        if seed is not None:
            values[SEED_KEY] = seed
        return ServerSampling(values)

    def without_seed(self) -> ServerSampling:
        """As queued for a batch (no per-sample seed), or sent to a server that predates seeds."""
        if SEED_KEY not in self._values:
            return self
        return ServerSampling({key: value for key, value in self._values.items() if key != SEED_KEY})

    def as_map(self) -> dict[str, Any]:
        """A plain copy of the map, as msgpack and JSON carry it (payloads, records, failures)."""
        return dict(self._values)


# Every key a /generate request of ours carries: for_server()'s keys plus the per-sample
# `sampling_seed` the worker adds. A server's preferred sampling params on any other key would
# apply to our requests (preflight refuses such a server).
SENT_SAMPLING_KEYS = frozenset({*SamplingParams().for_server(), SEED_KEY})


def version_tuple(version: str | None) -> tuple[int, ...]:
    """(0, 5, 23) from "0.5.23" or "0.32.0rc1+cpu" (a server's version); unparsable parts end the tuple."""
    match = re.match(r"\d+(?:\.\d+)*", version or "")
    return tuple(int(part) for part in match.group().split(".")) if match else ()
