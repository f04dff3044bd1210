"""A token-in/token-out client for SGLang's native HTTP API.

It sends `input_ids`, keeps `output_ids`, and turns every way a request can go wrong into
one of three exceptions the batch runner classifies: ServerDown (not listening: nothing to
retry until health says so), TransientError (timeouts, resets, 429, 5xx: retry with
backoff) and BadRequest (400: the prompt or its parameters, never worth a retry).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import requests
from requests.adapters import HTTPAdapter

# Connections kept open per server: enough for every pool child's batch plus probes.
POOL_CONNECTIONS = 64
# Seconds to open a TCP connection; a listening server accepts at once even when busy.
CONNECT_TIMEOUT = 5.0
# Seconds a /health probe may take: SGLang's own check gives up after 20 s (503).
HEALTH_TIMEOUT = 25.0
# Seconds for the small info endpoints.
INFO_TIMEOUT = 10.0


class ClientError(Exception):
    """Base of the client's errors; `status` is the HTTP status if there was a response."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ServerDown(ClientError):
    """The server is not accepting connections (loading weights, dead, restarting)."""


class TransientError(ClientError):
    """A failure that may pass: timeout, dropped connection, 429, 5xx."""


class BadRequest(ClientError):
    """The server refused the request as malformed (HTTP 400); its message is kept."""


def error_message(body: bytes, status: int) -> str:
    """The message of an error reply, whichever of SGLang's shapes it has."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:500].decode(errors="replace") or f"HTTP {status}"
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in parsed:
            return str(parsed["message"])
        if isinstance(error, str):
            return error
    return str(parsed)[:500]


def error_for_status(status: int, body: bytes, *, path: str) -> ClientError | None:
    """The error a non-200 reply stands for (None for 200): 400 is the request's fault, the
    rest (429, 5xx, ...) may pass."""
    if status == 200:
        return None
    if status == 400:
        return BadRequest(error_message(body, status), status=400)
    return TransientError(f"{path} answered {status}: {error_message(body, status)}", status=status)


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What preflight learns about a server.

    Parameters:
        url: base URL.
        server_info: `/get_server_info` (or `/server_info`) as returned.
        model_info: `/get_model_info` as returned.
        context_length: effective context length (`/v1/models` max_model_len, else server_info).
        version: SGLang version string, if reported.
    """

    url: str
    server_info: dict
    model_info: dict
    context_length: int | None
    version: str | None


class SGLangClient:
    """HTTP client for one SGLang server.

    Parameters:
        url: base URL, e.g. http://gpu-host:30000.
        pool_connections: keep-alive connections kept per server.
    """

    def __init__(self, url: str, *, pool_connections: int = POOL_CONNECTIONS) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        # Retries are classified by the batch runner, not hidden in the transport.
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=pool_connections, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        # Read proxy settings once: requests would scan the environment on every request,
        # which is a large share of a worker's CPU per batch.
        self.session.proxies.update(requests.utils.get_environ_proxies(self.url))
        self.session.trust_env = False

    def _request(self, method: str, path: str, *, timeout: float, json: dict | None = None) -> requests.Response:
        try:
            return self.session.request(
                method, f"{self.url}{path}", json=json, timeout=(CONNECT_TIMEOUT, timeout)
            )
        except requests.ConnectionError as exc:
            # A refused connection means nothing listens; a reset mid-request may be a dying
            # server or a network blip: the caller's health check tells them apart.
            text = str(exc)
            if "refused" in text.lower() or "Failed to establish" in text:
                raise ServerDown(f"{self.url}: connection refused") from exc
            raise TransientError(f"{self.url}{path}: connection error: {exc}") from exc
        except requests.Timeout as exc:
            raise TransientError(f"{self.url}{path}: no answer within {timeout:.0f} s") from exc
        except requests.RequestException as exc:
            raise TransientError(f"{self.url}{path}: {exc}") from exc

    def generate(self, input_ids: list[list[int]], sampling_params: dict | list[dict], *,
                 timeout: float, rids: list[str] | None = None) -> list[dict]:
        """POST /generate for a batch; returns one response item per prompt, in order."""
        body: dict = {"input_ids": input_ids, "sampling_params": sampling_params}
        if rids is not None:
            body["rid"] = rids
        response = self._request("POST", "/generate", timeout=timeout, json=body)
        error = error_for_status(response.status_code, response.content, path="/generate")
        if error is not None:
            raise error
        try:
            items = response.json()
        except ValueError as exc:
            raise TransientError(f"/generate answered 200 with a body that is not JSON: {exc}") from exc
        if isinstance(items, dict):
            items = [items]
        if not isinstance(items, list) or len(items) != len(input_ids):
            raise TransientError(
                f"/generate answered {len(items) if isinstance(items, list) else type(items).__name__} "
                f"items for {len(input_ids)} prompts"
            )
        return items

    def health(self, *, timeout: float = HEALTH_TIMEOUT) -> tuple[bool, str]:
        """(healthy, detail). Raises ServerDown when nothing listens."""
        try:
            response = self._request("GET", "/health", timeout=timeout)
        except TransientError as exc:
            return False, str(exc)
        if response.status_code == 200:
            return True, "ok"
        return False, f"/health answered {response.status_code}"

    def _get_json(self, *paths: str) -> dict:
        last: Exception | None = None
        for path in paths:
            response = self._request("GET", path, timeout=INFO_TIMEOUT)
            if response.status_code == 200:
                try:
                    return response.json()
                except ValueError as exc:
                    last = exc
                    continue
            last = ClientError(f"{path} answered {response.status_code}", status=response.status_code)
        raise TransientError(f"{self.url}: none of {paths} answered: {last}")

    def facts(self) -> ServerFacts:
        """Server info, model info and the effective context length."""
        server_info = self._get_json("/get_server_info", "/server_info")
        model_info = self._get_json("/get_model_info")
        context_length = None
        try:
            models = self._get_json("/v1/models")
            context_length = models["data"][0].get("max_model_len")
        except (TransientError, KeyError, IndexError, TypeError):
            pass
        if not context_length:
            context_length = server_info.get("context_length")
        return ServerFacts(
            url=self.url,
            server_info=server_info,
            model_info=model_info,
            context_length=int(context_length) if context_length else None,
            version=server_info.get("version"),
        )

    def close(self) -> None:
        self.session.close()
