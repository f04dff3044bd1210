"""FaultPlan: which /generate requests fail, drop or end the server, from a seeded RNG."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

# What to do with one /generate request.
SERVE = "serve"
FAIL = "fail"
DROP = "drop"


@dataclass(frozen=True, slots=True)
class GenerateFate:
    """The fault decision for one /generate request.

    Parameters:
        number: 1-based arrival number of the request.
        action: SERVE, FAIL (HTTP 500) or DROP (close without a response).
        die_after_response: this is the --die-after request; the server dies once it answered.
    """

    number: int
    action: str
    die_after_response: bool


class FaultPlan:
    """Seeded fault injection, reproducible for a given seed and arrival order.

    Behaviour: each /generate request draws one number: below fail_rate it fails, below
    fail_rate + drop_rate it is dropped. Health probes draw from their own RNG, so how often a
    client polls health does not change which generate requests fail.

    Parameters:
        fail_rate, drop_rate, health_fail_rate: probabilities in [0, 1].
        die_after: arrival number of the last request answered; None = never.
        seed: RNG seed.
    """

    def __init__(
        self,
        *,
        fail_rate: float,
        drop_rate: float,
        health_fail_rate: float,
        die_after: int | None,
        seed: int,
    ) -> None:
        self.fail_rate = fail_rate
        self.drop_rate = drop_rate
        self.health_fail_rate = health_fail_rate
        self.die_after = die_after
        self._generate_rng = random.Random(f"devserver-generate-faults-{seed}")
        self._health_rng = random.Random(f"devserver-health-faults-{seed}")
        self._count = 0
        self._lock = threading.Lock()

    def next_generate(self) -> GenerateFate:
        """Decide the fate of the next /generate request."""
        with self._lock:
            self._count += 1
            draw = self._generate_rng.random()
            number = self._count
        if draw < self.fail_rate:
            action = FAIL
        elif draw < self.fail_rate + self.drop_rate:
            action = DROP
        else:
            action = SERVE
        return GenerateFate(
            number=number,
            action=action,
            die_after_response=self.die_after is not None and number == self.die_after,
        )

    def health_flake(self) -> bool:
        """True when this (post-warm-up) health probe should answer a false 503."""
        if self.health_fail_rate <= 0:
            return False
        with self._lock:
            return self._health_rng.random() < self.health_fail_rate
