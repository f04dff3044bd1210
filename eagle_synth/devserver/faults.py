"""FaultPlan: which generation requests (/generate, or /v1/completions with --api vllm) fail,
drop, come back malformed or end the server, from a seeded RNG."""

from __future__ import annotations

import itertools
import random
import threading
from dataclasses import dataclass
from typing import Any

# What to do with one generation request.
SERVE = "serve"
FAIL = "fail"
DROP = "drop"
MALFORMED = "malformed"
# The malformed item shapes, used in turn by --malformed-rate: the item replaced by a bare list
# of ints, meta_info a string, ids as strings, negative ids, no output_ids at all.
MALFORMED_SHAPES = ("list-of-ints", "meta-info-string", "ids-as-strings", "negative-ids", "missing-output-ids")


def malform(reply: Any, shape: str, key: str = "output_ids") -> Any:
    """A broken copy of a /generate reply item (of a batch: its first), its ids under `key`."""
    if isinstance(reply, list):
        return [malform(reply[0], shape), *reply[1:]]
    ids = list(reply.get(key) or [0])
    if shape == "list-of-ints":
        return ids
    broken = {k: v for k, v in reply.items() if not (k == key and shape == "missing-output-ids")}
    if shape in ("ids-as-strings", "negative-ids"):
        broken[key] = [str(i) for i in ids] if shape == "ids-as-strings" else [-1 - i for i in ids]
    if shape == "meta-info-string":
        broken["meta_info"] = str(reply.get("meta_info"))
    return broken


def malform_completion(reply: Any, shape: str) -> Any:
    """A broken copy of one /v1/completions reply (meta-info-string makes `choices` a string)."""
    if shape == "meta-info-string":
        return {**reply, "choices": str(reply["choices"])}
    choice = malform(reply["choices"][0], shape, "token_ids")
    return choice if shape == "list-of-ints" else {**reply, "choices": [choice, *reply["choices"][1:]]}


@dataclass(frozen=True, slots=True)
class GenerateFate:
    """The fault decision for one generation request, by its 1-based arrival `number`."""

    number: int
    action: str
    die_after_response: bool
    malformed_shape: str | None = None


@dataclass(kw_only=True)
class FaultPlan:
    """Seeded fault injection, reproducible for a given seed and arrival order: each generation
    request draws one number, failing below fail_rate, dropped below + drop_rate, malformed
    (the shapes in turn) below + malformed_rate. Health probes draw from their own RNG, so how
    often a client polls health does not change which generate requests fail."""

    fail_rate: float
    drop_rate: float
    health_fail_rate: float
    die_after: int | None
    seed: int
    malformed_rate: float = 0.0

    def __post_init__(self) -> None:
        rates = itertools.accumulate((self.fail_rate, self.drop_rate, self.malformed_rate))
        self._bounds = tuple(zip((FAIL, DROP, MALFORMED), rates))
        self._generate_rng = random.Random(f"devserver-generate-faults-{self.seed}")
        self._health_rng = random.Random(f"devserver-health-faults-{self.seed}")
        self._count = 0
        self._malformed_count = 0
        self._lock = threading.Lock()

    def next_generate(self) -> GenerateFate:
        shape = None
        with self._lock:
            self._count += 1
            draw = self._generate_rng.random()
            action = next((action for action, bound in self._bounds if draw < bound), SERVE)
            if action == MALFORMED:
                shape = MALFORMED_SHAPES[self._malformed_count % len(MALFORMED_SHAPES)]
                self._malformed_count += 1
            number = self._count
        return GenerateFate(number, action, self.die_after is not None and number == self.die_after, shape)

    def health_flake(self) -> bool:
        with self._lock:
            return self._health_rng.random() < self.health_fail_rate
