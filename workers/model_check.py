"""Is a server serving the campaign's model? Asked once per server and campaign, before its first batch.

Preflight does not check the model: a server with another one answers the campaign's ids with
nonsense, or (SGLang) dies on the first id past its vocabulary. So the server tokenizes the
campaign's canary (eagle_synth/model_identity.py; `POST /tokenize`, `add_special_tokens: false`)
and the ids are compared with the campaign tokenizer's; an SGLang without /tokenize, or a
campaign without a canary, is not checked. A mismatch refuses the server with one line naming
both models (the health gate marks it refused, `status` shows it) and the batch goes back to
the queue: no prompt is burned.
"""

from __future__ import annotations

import json
import logging
import threading

from eagle_synth.state.campaign import CampaignSettings
from eagle_synth.state.node_state import ServerState
from workers.backends import backend_for_state
from workers.backends.base import redact_url
from workers.client import ServerClient, ServerDown, TransientError

log = logging.getLogger("eagle_synth.model_check")

# Prefix of the detail a batch hands the health gate for a server to refuse (a suspect report).
REFUSE_PREFIX = "refuse: "
# Seconds the /tokenize request may take.
TOKENIZE_TIMEOUT = 30.0
# Ids of each side quoted in the refusal line.
QUOTED_IDS = 8


def served_tokens(client: ServerClient, state: ServerState, text: str) -> list[int] | None:
    """The ids the server gives `text` (no special tokens added), None without /tokenize;
    transport failures raise (the batch's own requests handle them)."""
    model = getattr(backend_for_state(state), "model", None)  # vLLM's served name, as its requests send it
    body = {"prompt": text, "add_special_tokens": False, **({} if model is None else {"model": model})}
    status, raw = client.post_json("/tokenize", body, timeout=TOKENIZE_TIMEOUT)
    if status != 200:
        return None
    try:
        tokens = json.loads(raw).get("tokens")
    except (ValueError, AttributeError):
        return None
    return tokens if isinstance(tokens, list) and all(isinstance(t, int) for t in tokens) else None


def mismatch_line(url: str, state: ServerState, settings: CampaignSettings, tokens: list[int]) -> str | None:
    """The refusal line when the server's canary ids differ from the campaign's, else None."""
    if tokens == (expected := settings.tokenizer_canary.get("ids")):
        return None
    names = ((state.provenance or {}).get(key) for key in ("model_path", "served_model_name"))  # what it serves
    served = next((name for name in names if isinstance(name, str) and name), "an unnamed model")
    return (
        f"refusing server {redact_url(url)}: it serves {served}, whose tokenizer does not match "
        f"campaign {settings.name!r}'s ({settings.tokenizer_path}, fingerprint {settings.tokenizer_fingerprint}): "
        f"the canary {settings.tokenizer_canary.get('text', '')!r} is {tokens[:QUOTED_IDS]} there, "
        f"{list(expected or [])[:QUOTED_IDS]} here"
    )


class ModelCheck:
    """The per-process memo of which servers serve which campaign's model (`clients`: one per URL)."""

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
        if tokens is None:
            log.info("server %s does not tokenize (no /tokenize): its model is not checked", url)
        line = None if tokens is None else mismatch_line(url, state, settings, tokens)
        with self._lock:
            self._known[key] = line
        return line
