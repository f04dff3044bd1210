"""Does a server serve a campaign's model? Asked of every server for every campaign before
the worker takes any batch of it (workers/servers/routing.py), and again whenever the server's state
changes (a restart may bring another model behind the same address).

Preflight does not check the model: a server with another one answers the campaign's ids with
nonsense, or (SGLang) dies on the first id past its vocabulary. So the server tokenizes the
campaign's canary (eagle_synth/model_identity.py; `POST /tokenize`, `add_special_tokens: false`)
and the ids are compared with the campaign tokenizer's. The answer is one of three: it serves
the campaign's model, it serves another (the line says which, naming both), or it cannot say
(no /tokenize, a server started with --skip-tokenizer-init, a campaign enqueued before
canaries): then only a worker pinned to the campaign sends it there (`worker --campaign`).
A mismatch concerns that campaign only: the server goes on serving the campaigns of its model.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

from eagle_synth.errors import ServerDown, TransientError
from eagle_synth.state.campaign import CampaignSettings
from eagle_synth.state.node_state import ServerState
from workers.backends import backend_for_state
from workers.backends.base import redact_url
from workers.servers.client import ServerClient

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
    """The line saying the server's canary ids differ from the campaign's, else None."""
    if tokens == (expected := settings.tokenizer_canary.get("ids")):
        return None
    names = ((state.provenance or {}).get(key) for key in ("model_path", "served_model_name"))  # what it serves
    served = next((name for name in names if isinstance(name, str) and name), "an unnamed model")
    return (
        f"not sending campaign {settings.name!r} to server {redact_url(url)}: it serves {served}, whose tokenizer "
        f"does not match campaign {settings.name!r}'s ({settings.tokenizer_path}, fingerprint "
        f"{settings.tokenizer_fingerprint}): the canary {settings.tokenizer_canary.get('text', '')!r} is "
        f"{tokens[:QUOTED_IDS]} there, {list(expected or [])[:QUOTED_IDS]} here"
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a server is to a campaign: `serves` True (its model), False (another: `line` says
    which), None (it cannot say: `line` says why)."""

    serves: bool | None
    line: str | None = None


class ModelCheck:
    """The per-process memo of which servers serve which model (`clients`: one per URL), keyed by
    the server, the campaign's tokenizer fingerprint and when the server last changed state."""

    def __init__(self, clients: dict[str, ServerClient]) -> None:
        self.clients = clients
        self._known: dict[tuple[str, str, float], Verdict] = {}
        self._lock = threading.Lock()

    def verdict(self, url: str, state: ServerState, settings: CampaignSettings) -> Verdict:
        """Whether `url` (in `state`) serves the campaign's model; a server that cannot be asked
        right now (down, slow) gives an unremembered "cannot say"."""
        if not settings.tokenizer_canary.get("ids"):
            return Verdict(None, f"campaign {settings.name!r} has no tokenizer canary (enqueued by an older version)")
        key = (url, settings.tokenizer_fingerprint, state.since)
        with self._lock:
            if (known := self._known.get(key)) is not None:
                return known
        try:
            tokens = served_tokens(self.clients[url], state, settings.tokenizer_canary["text"])
        except (ServerDown, TransientError) as exc:
            return Verdict(None, f"cannot ask server {redact_url(url)} for its model now: {exc}")
        if tokens is None:
            found = Verdict(
                None, f"server {redact_url(url)} does not tokenize (no /tokenize): its model cannot be checked"
            )
        elif (line := mismatch_line(url, state, settings, tokens)) is not None:
            found = Verdict(False, line)
        else:
            found = Verdict(True)
        with self._lock:
            self._known[key] = found
        return found

    def problem(self, url: str, state: ServerState, settings: CampaignSettings) -> str | None:
        """The mismatch line when `url` serves another model than the campaign's, else None."""
        found = self.verdict(url, state, settings)
        return found.line if found.serves is False else None
