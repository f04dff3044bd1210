"""Is a server serving the campaign's model? Asked once per server and campaign, before its first batch.

Preflight checks a server's settings, but not which model it serves: a server loaded with
another model takes the campaign's ids and answers with nonsense, or (SGLang) dies on the
first id past its vocabulary, after which the worker only sees "connection refused". So
before a campaign's first batch goes to a server, the server tokenizes the campaign's canary
(a text with the tokenizer's special tokens, eagle_synth/model_identity.py) and the ids are
compared with the campaign tokenizer's:

* vLLM: `POST /tokenize` with `add_special_tokens: false` -> `tokens`; `/v1/models` `root`
  names the model in the message;
* SGLang: `POST /tokenize` where the version serves it (newer ones do), `model_path` of
  /model_info names it; an older SGLang that has no /tokenize is not checked.

A mismatch refuses the server with one line naming both (the health gate marks it refused:
`status` shows the line), and the batch goes back to the queue: no prompt is burned.
A campaign enqueued before canaries existed is not checked.
"""

from __future__ import annotations

import json
import logging
import threading

from eagle_synth.state.campaign import CampaignSettings
from eagle_synth.state.node_state import ServerState
from workers.backends.base import VLLM, redact_url
from workers.client import ServerClient, ServerDown, TransientError

log = logging.getLogger("eagle_synth.model_check")

# Prefix of the detail a batch hands the health gate for a server to refuse (a suspect report).
REFUSE_PREFIX = "refuse: "
# Seconds the /tokenize request may take.
TOKENIZE_TIMEOUT = 30.0
# Ids of each side quoted in the refusal line.
QUOTED_IDS = 8


def served_tokens(client: ServerClient, state: ServerState, text: str) -> list[int] | None:
    """The ids the server's tokenizer gives `text` (no special tokens added), or None when it
    does not say (no /tokenize). Transport failures raise (the batch's own requests handle them)."""
    body: dict = {"prompt": text, "add_special_tokens": False}
    served = (state.provenance or {}).get("served_model_name")
    if state.backend == VLLM and isinstance(served, str):
        body["model"] = served
    status, raw = client.post_json("/tokenize", body, timeout=TOKENIZE_TIMEOUT)
    if status != 200:
        return None
    try:
        tokens = json.loads(raw).get("tokens")
    except (ValueError, AttributeError):
        return None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens


def served_model(state: ServerState) -> str:
    """What the server says it serves, for the message."""
    provenance = state.provenance or {}
    for key in ("model_root", "model_path", "model", "served_model_name"):
        value = provenance.get(key)
        if isinstance(value, str) and value:
            return value
    return "an unnamed model"


def mismatch_line(url: str, state: ServerState, settings: CampaignSettings, tokens: list[int]) -> str | None:
    """The refusal line when the server's canary ids differ from the campaign's, else None."""
    expected = settings.tokenizer_canary.get("ids")
    if tokens == expected:
        return None
    return (
        f"refusing server {redact_url(url)}: it serves {served_model(state)}, whose tokenizer does not match "
        f"campaign {settings.name!r}'s ({settings.tokenizer_path}, fingerprint {settings.tokenizer_fingerprint}): "
        f"the canary {settings.tokenizer_canary.get('text', '')!r} is {tokens[:QUOTED_IDS]} there, "
        f"{list(expected or [])[:QUOTED_IDS]} here"
    )


class ModelCheck:
    """The per-process memo of which servers serve which campaign's model.

    Parameters:
        clients: one HTTP client per server URL.
    """

    def __init__(self, clients: dict[str, ServerClient]) -> None:
        self.clients = clients
        self._known: dict[tuple[str, str], str | None] = {}
        self._lock = threading.Lock()

    def problem(self, url: str, state: ServerState, settings: CampaignSettings) -> str | None:
        """None when `url` serves the campaign's model (or cannot tell), else the refusal line."""
        if not settings.tokenizer_canary.get("ids"):
            return None
        key = (url, settings.tokenizer_fingerprint)
        with self._lock:
            if key in self._known:
                return self._known[key]
        try:
            tokens = served_tokens(self.clients[url], state, settings.tokenizer_canary["text"])
        except (ServerDown, TransientError) as exc:
            log.info("server %s: cannot check its model now (%s)", url, exc)
            return None  # not remembered: looked at again on the next batch
        line = None if tokens is None else mismatch_line(url, state, settings, tokens)
        if tokens is None:
            log.info("server %s does not tokenize (no /tokenize): its model is not checked", url)
        with self._lock:
            self._known[key] = line
        return line
