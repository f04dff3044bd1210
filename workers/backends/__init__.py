"""The kinds of server a worker drives (SGLang and vLLM), by name; preflight (workers/servers/preflight.py)
tells which one a server is.

A `Backend` serves one server URL: `name` is its kind, `path` its generation endpoint, `checks`
the refusable settings preflight looks for (setting name -> check). `translate_sampling` makes
every value of the campaign's sampling (SGLang's names, eagle_synth/sampling.py) explicit in the
kind's names or raises UntranslatableSampling; `request(ids, sampling)` is (path, JSON body),
the sampling translated there, once per request; `parse(reply, sent=...)` checks one decoded 200
reply and makes it the prompt's Record (BadResponse for malformed shapes, PromptMismatch when the
server generated from other ids, SamplingOverridden when it did not sample as asked,
ReplyAborted when it dropped the prompt);
`context_problem` is None when the prompt is served exactly as asked, else why not. Preflight:
`facts(client)` is what the server says about itself (raises ServerDown, TransientError, or
PreflightError), `apply_facts` stores it in the node's server state, `from_state` rebuilds the
backend from that state.
"""

from __future__ import annotations

from eagle_synth.state.node_state import ServerState
from workers.backends.base import SGLANG, VLLM
from workers.backends.sglang import SGLangBackend
from workers.backends.vllm import VllmBackend

Backend = SGLangBackend | VllmBackend
# Every kind, by name.
BACKENDS: dict[str, type[Backend]] = {SGLANG: SGLangBackend, VLLM: VllmBackend}
# Names `--allow-server-setting` accepts: every kind's refusable settings, SGLang's first.
REFUSABLE_SETTINGS = tuple(dict.fromkeys([*SGLangBackend.checks, *VllmBackend.checks]))


def backend_for_state(state: ServerState | None) -> Backend | None:
    """The backend of a server preflight accepted (None while its kind is unknown)."""
    if state is None or state.backend not in BACKENDS:
        return None
    return BACKENDS[state.backend].from_state(state)
