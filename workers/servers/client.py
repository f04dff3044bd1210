"""A token-in/token-out HTTP client for one inference server (SGLang or vLLM): health, the small
info endpoints, JSON posts (request and reply shapes are in workers/backends/). A blocking call
is the natural form for these probes, so it uses `requests`; its failures, and the API key it
sends, go through workers/servers/transport.py like the in-flight pool's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import requests
from requests.adapters import HTTPAdapter

from eagle_synth.errors import TransientError
from workers.servers.transport import CONNECT_TIMEOUT, REQUESTS_ERRORS, auth_headers, transport_error, unauthorized

# Keep-alive connections per server of the synchronous client.
POOL_CONNECTIONS = 64
# Seconds the info endpoints may take (a /health probe takes the worker's --probe-timeout).
INFO_TIMEOUT = 10.0
# Bytes asked of the socket per read while an answer's body arrives (each read returns what is there).
READ_PIECE = 65536


def positive_int(value: object) -> int | None:
    """An int > 0 from a JSON value (ints, integral floats, digit strings), else None."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):  # OverflowError: Infinity, which json.loads reads
        return None
    return number if number > 0 and not (isinstance(value, float) and value != number) else None


def first_model(models: dict | None) -> dict:
    """The first model card of a `/v1/models` answer, {} when there is none."""
    data = (models or {}).get("data")
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What preflight learns about a server: `server_info`, `model_info` (SGLang's /server_info
    and /model_info; vLLM's dev-mode configuration if exposed and its /v1/models card), the
    effective `context_length`, its scheduler's `max_running_requests`, the tokens its KV cache
    holds (`max_total_num_tokens`) and what vLLM's probe request saw."""

    url: str
    server_info: dict
    model_info: dict
    context_length: int | None
    version: str | None
    max_running_requests: int | None = None
    max_total_num_tokens: int | None = None
    probe: dict | None = None


class ServerClient:
    """HTTP client for one server, SGLang or vLLM, at base `url` (e.g. http://gpu-host:30000),
    keeping up to `pool_connections` keep-alive connections, sending `api_key` (if any) as a
    bearer token."""

    def __init__(self, url: str, *, pool_connections: int = POOL_CONNECTIONS, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.sends_key = api_key is not None
        self.session = requests.Session()
        self.session.headers.update(auth_headers(api_key))
        # Retries are classified by the batch runner, not hidden in the transport.
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=pool_connections, max_retries=0)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        # Read proxy settings once: requests would scan the environment on every request,
        # which is a large share of a worker's CPU per batch.
        self.session.proxies.update(requests.utils.get_environ_proxies(self.url))
        self.session.trust_env = False

    def _request(self, method: str, path: str, *, timeout: float, json: dict | None = None) -> requests.Response:
        """One request whose whole answer must arrive within `timeout` seconds: requests' own
        timeout bounds each read, so a server trickling a byte every few seconds would hold the
        caller forever; the body is read here in pieces and given up on at the deadline."""
        deadline = time.monotonic() + timeout
        try:
            response = self.session.request(
                method, f"{self.url}{path}", json=json, timeout=(CONNECT_TIMEOUT, timeout), stream=True
            )
            try:
                body = bytearray()
                while piece := response.raw.read1(READ_PIECE, decode_content=True):
                    body += piece
                    if time.monotonic() > deadline:
                        raise requests.Timeout(f"the answer was not complete after {timeout:.0f} s")
            except BaseException:
                response.close()  # the connection is in an unknown state: never reused
                raise
            response._content = bytes(body)  # what .content and .json() read
            response.raw.release_conn()
            status, sent_key = response.status_code, self.sends_key
            if refused := unauthorized(status, response.content, url=self.url, path=path, sent_key=sent_key):
                raise refused  # an API key missing or wrong: whatever the path, the server is refused
            return response
        except REQUESTS_ERRORS as exc:
            raise transport_error(exc, url=self.url, path=path, timeout=timeout) from exc

    def health(self, *, timeout: float) -> tuple[bool, str]:
        """(healthy, detail). Raises ServerDown when nothing listens."""
        try:
            response = self._request("GET", "/health", timeout=timeout)
        except TransientError as exc:
            return False, str(exc)
        ok = response.status_code == 200
        return ok, "ok" if ok else f"/health answered {response.status_code}"

    def _get_json(self, *paths: str) -> dict:
        """The JSON object of the first of `paths` that answers one; TransientError if none does."""
        if (body := self.get_optional_json(*paths)) is None:
            raise TransientError(f"{self.url}: none of {paths} answered a JSON object")
        return body

    def get_optional_json(self, *paths: str) -> dict | None:
        """GET each of `paths` in turn: the first JSON object one answers, None when each answers
        anything else (404, not JSON); raises ServerDown / TransientError when one does not answer."""
        for path in paths:
            response = self._request("GET", path, timeout=INFO_TIMEOUT)
            try:
                body = response.json() if response.status_code == 200 else None
            except ValueError:
                continue
            if isinstance(body, dict):
                return body
        return None

    def post_json(self, path: str, body: dict, *, timeout: float) -> tuple[int, bytes]:
        """POST a JSON body; (status, raw reply)."""
        response = self._request("POST", path, timeout=timeout, json=body)
        return response.status_code, response.content

    def facts(self) -> ServerFacts:
        """An SGLang server's facts. The current endpoints first: SGLang logs a deprecation warning
        on every call of the `get_*` forms, which older servers only have."""
        server_info = self._get_json("/server_info", "/get_server_info")
        model_info = self._get_json("/model_info", "/get_model_info")
        # /v1/models max_model_len is what SGLang checks prompts against (model_config.context_len);
        # server_info's context_length is only the launch flag, null when not given.
        try:
            card = first_model(self.get_optional_json("/v1/models"))
        except TransientError:
            card = {}
        return ServerFacts(
            url=self.url,
            server_info=server_info,
            model_info=model_info,
            context_length=positive_int(card.get("max_model_len")) or positive_int(server_info.get("context_length")),
            version=server_info.get("version"),
            max_running_requests=positive_int(server_info.get("max_running_requests")),
            max_total_num_tokens=positive_int(server_info.get("max_total_num_tokens")),
        )
