"""The kinds of server a worker drives (SGLang and vLLM), by name; preflight (workers/preflight.py)
tells which one a server is."""

from __future__ import annotations

from eagle_synth.state.node_state import ServerState
from workers.backends.base import AUTO, BACKEND_CHOICES, SGLANG, VLLM, Backend, UntranslatableSampling
from workers.backends.sglang import SGLangBackend
from workers.backends.vllm import VllmBackend

# Every kind, by name.
BACKENDS: dict[str, type[SGLangBackend] | type[VllmBackend]] = {SGLANG: SGLangBackend, VLLM: VllmBackend}
# Names `--allow-server-setting` accepts: every kind's refusable settings, SGLang's first.
REFUSABLE_SETTINGS = tuple(dict.fromkeys([*SGLangBackend.checks, *VllmBackend.checks]))
# What each kind's model card says in /v1/models `owned_by`.
OWNERS = {"sglang": SGLANG, "vllm": VLLM}

__all__ = [
    "AUTO",
    "BACKEND_CHOICES",
    "BACKENDS",
    "Backend",
    "OWNERS",
    "REFUSABLE_SETTINGS",
    "SGLANG",
    "VLLM",
    "UntranslatableSampling",
    "backend_for_state",
]


def backend_for_state(state: ServerState | None) -> Backend | None:
    """The backend of a server preflight accepted (None while its kind is unknown)."""
    if state is None or state.backend not in BACKENDS:
        return None
    return BACKENDS[state.backend].from_state(state)
