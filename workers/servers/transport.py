"""How a worker talks to its servers, whatever the HTTP library: the one place that adds the
servers' API key (`auth_headers`), the one mapping of transport failures (`transport_error`, for
`requests` in workers/servers/client.py and aiohttp in workers/inflight.py) and of HTTP statuses
(`error_for_status`, `unauthorized`) to the errors the batch runner classifies.

ServerDown (not listening: wait for health), TransientError (timeouts, resets, 429, 5xx: retry
with backoff), BadRequest (400: never retried), BadSamplingParams (a 400 about the campaign's
sampling rather than one prompt), Unauthorized (401/403: the server checks an API key this
worker lacks; the server is refused).

A server started with `--api-key` gets it as `Authorization: Bearer <key>` on every request
(`api_key`, from EAGLE_SYNTH_SERVER_API_KEY); SGLang checks it on every path but /health and
/metrics, vLLM on /v1/... only.
"""

from __future__ import annotations

import json
import re

import aiohttp
import requests
import urllib3

from eagle_synth.errors import (
    BadRequest,
    BadSamplingParams,
    ClientError,
    ServerDown,
    TransientError,
    Unauthorized,
)
from eagle_synth.sampling import SGLANG_SAMPLING_KEYS

# Seconds to open a TCP connection (a listening server accepts at once even when busy).
CONNECT_TIMEOUT = 5.0
# What each library raises when a request does not get through (`transport_error` maps them):
# requests (with the urllib3 errors it lets pass while a body streams), aiohttp (and asyncio's
# timeout).
REQUESTS_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError)
AIOHTTP_ERRORS = (aiohttp.ClientError, TimeoutError)


# How the servers word a 400 caused by the sampling, whatever the version: an unknown key
# (msgspec's "Unexpected keyword argument 'seed'", Python's "got an unexpected keyword
# argument"), a mistyped value (msgspec's "Expected `float`, got `str` - at `$.temperature`", a
# comparison inside SGLang's verify(), vLLM's pydantic "('body', '<field>')"), an out-of-range
# one ("<field> must ...", from SGLang's sampling_params.py verify() and vLLM's
# sampling_params.py _verify_args()), "Only one of regex, json_schema, or ebnf can be set.".
# The fields: SGLang's sampling keys and the names vLLM gives four of them.
_SAMPLING_FIELDS = "|".join(
    sorted({*SGLANG_SAMPLING_KEYS, "max_tokens", "min_tokens", "seed", "include_stop_str_in_output"})
)
SAMPLING_ERROR = re.compile(
    r"(?i:unexpected keyword argument|sampling[_ ]?param|expected `[^`]+`, got `[^`]+`"
    r"|not supported between instances of|only one of regex, json_schema, or ebnf)"
    rf"|\b({_SAMPLING_FIELDS})\b[^.]*\bmust\b|\('body', '({_SAMPLING_FIELDS})'\)"
)


def is_sampling_error(message: str) -> bool:
    """True when a 400's message says the sampling parameters are wrong (not the prompt)."""
    if "input_ids" in message or "'prompt'" in message:
        return False  # about the prompt ids (e.g. a mistyped id), which differ per prompt
    return SAMPLING_ERROR.search(message) is not None


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


# The environment variable holding the servers' API key (WorkerConfig.server_api_key), for messages.
API_KEY_ENV = "EAGLE_SYNTH_SERVER_API_KEY"


def unauthorized(status: int, body: bytes, *, url: str, path: str, sent_key: bool) -> Unauthorized | None:
    """The refusal a 401/403 of server `url` stands for, saying what to fix (`sent_key`: we sent a
    key, so it is the wrong one); None for any other status."""
    if status not in (401, 403):
        return None
    fix = f"{API_KEY_ENV} is not the key the server was started with"
    fix = fix if sent_key else f"the server checks an API key (--api-key): set {API_KEY_ENV} to it"
    return Unauthorized(f"refusing server {url}: {path} answered {status} ({error_message(body, status)}): {fix}")


def error_for_status(status: int, body: bytes, *, path: str, url: str, sent_key: bool = False) -> ClientError | None:
    """The error a non-200 reply of server `url` stands for (None for 200): 400 is the request's
    fault, 401/403 an API key missing or wrong (`unauthorized`), the rest may pass."""
    if status == 200:
        return None
    if refused := unauthorized(status, body, url=url, path=path, sent_key=sent_key):
        return refused
    if status == 400:
        message = error_message(body, status)
        if is_sampling_error(message):
            return BadSamplingParams(f"the server refused the sampling parameters: {message}")
        return BadRequest(message)
    return TransientError(f"{path} answered {status}: {error_message(body, status)}")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The headers carrying the servers' --api-key, as SGLang and vLLM check it (none without one)."""
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}


def transport_error(exc: BaseException, *, url: str, path: str, timeout: float) -> ClientError:
    """The error a request to server `url` stands for when it did not get through (`exc`, one
    of REQUESTS_ERRORS or AIOHTTP_ERRORS; `timeout`: the seconds the whole answer had)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ServerDown(f"{url}: connection refused ({exc.os_error})")
    if isinstance(exc, requests.ConnectionError):
        # A refused connection means nothing listens; a reset mid-request may be a dying
        # server or a network blip: the caller's health check tells them apart.
        text = str(exc)
        if "refused" in text.lower() or "Failed to establish" in text:
            return ServerDown(f"{url}: connection refused")
        return TransientError(f"{url}{path}: connection error: {exc}")
    if isinstance(exc, requests.Timeout | TimeoutError):
        return TransientError(f"{url}{path}: no answer within {timeout:.0f} s")
    if isinstance(exc, aiohttp.ClientError):
        return TransientError(f"{url}{path}: connection error: {exc!r}")
    return TransientError(f"{url}{path}: {exc}")
