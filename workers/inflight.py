"""InflightPool: the worker's process-wide set of in-flight generation requests, refilled per prompt.

The unit of in-flight work is one prompt, not a batch (docs/workers.md "Keeping the GPU full"):
SGLang frees a slot the moment a sequence ends and outputs are heavy-tailed, so all prompts wait
in one first-in-first-out line and a finished prompt hands its ticket to the next, whichever batch
it is of. Requests run on one asyncio event loop in a daemon thread (aiohttp); batch threads wait
on Futures that always resolve to an `Answer`, built by each server's backend (workers/backends/).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NamedTuple

import aiohttp
import orjson

from eagle_synth.errors import ClientError, ServerDown, TransientError, Unauthorized
from eagle_synth.sampling import ServerSampling
from workers import metrics
from workers.affinity import PrefixAffinity, affinity_enabled, least_loaded
from workers.backends import Backend
from workers.servers.transport import AIOHTTP_ERRORS, CONNECT_TIMEOUT, auth_headers, error_for_status, transport_error

log = logging.getLogger("eagle_synth.inflight")

# Seconds between calls of the pool's `on_tick` (routing refresh, in-flight report).
TICK_INTERVAL = 0.5
# Seconds `close` waits for the loop thread to stop.
CLOSE_TIMEOUT = 5.0
# Headers of every generation request (the body is JSON encoded here, see `_json_body`).
JSON_HEADERS = {"Content-Type": "application/json"}


def _json_body(body: dict, ids: list[int]) -> bytes:
    """`body` as JSON: the prompt ids (nearly all of it) by orjson at a tenth of json's CPU, the
    rest by json (orjson writes NaN as null), so the server gets what `json.dumps(body)` gives."""
    parts = []
    for key, value in body.items():
        encoded = None
        if value is ids:
            try:
                encoded = orjson.dumps(value)
            except TypeError:  # an int beyond 64 bits: json writes it, the server judges it
                pass
        parts.append(json.dumps(key).encode() + b":" + (encoded or json.dumps(value).encode()))
    return b"{" + b",".join(parts) + b"}"


def _json_reply(raw: bytes) -> Any:
    """The decoded reply: orjson, or json for what orjson refuses (NaN, ints beyond 64 bits,
    non-UTF-8), so it decodes or fails as `json.loads` does."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


class Route(NamedTuple):
    """What one tick says of one server: tickets it may use now (0 = do not route), and the
    backend its requests are built with (None: unknown yet, keep what the pool has)."""

    tickets: int
    backend: Backend | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What became of one prompt's request to server `url`: `item` (the decoded reply, unchecked:
    `backend` built the request and checks it) or `error` (why there is none)."""

    url: str
    item: Any = None
    error: ClientError | None = None
    backend: Backend | None = None


@dataclass(eq=False, slots=True)
class _Job:
    ids: list[int]
    sampling: ServerSampling
    timeout: float
    tag: str
    future: Future
    # The servers this prompt may go to (its campaign's model's); None: any.
    servers: frozenset[str] | None = None
    # What it shares its prefix with (workers/affinity.py prefix_key); None: nothing.
    prefix: str | None = None


class InflightPool:
    """Send prompts to `servers` (base URLs) with a per-server in-flight limit, refilling each freed
    ticket: the oldest waiting prompt goes to the routable server with the most free tickets among
    those it may go to (its campaign's, workers/servers/routing.py), or, when `affinity` (default: unless
    EAGLE_SYNTH_PREFIX_AFFINITY=0) remembers a free one among them that served its prefix, to that
    one (workers/affinity.py); a prompt no free server may take lets the next one by; one refusing connections leaves routing until the next tick. Every `TICK_INTERVAL` seconds
    `on_tick(counts)` runs in a helper thread with the prompts in flight per (tag, url) and returns
    {url: Route}."""

    def __init__(
        self,
        *,
        servers: list[str],
        on_tick: Callable[[Mapping[tuple[str, str], int]], Mapping[str, Route]],
        api_key: str | None = None,
        affinity: PrefixAffinity | None = None,
    ) -> None:
        self.servers = list(servers)
        if affinity is None and affinity_enabled():
            affinity = PrefixAffinity()
        self._affinity = affinity
        # The servers' --api-key, added where ServerClient adds it (workers/servers/transport.py).
        self._headers = JSON_HEADERS | auth_headers(api_key)
        self._sends_key = api_key is not None
        self._on_tick = on_tick
        self._backends: dict[str, Backend] = {}
        self._limits: dict[str, int] = {}
        self._refused: set[str] = set()
        self._busy: Counter[str] = Counter()
        self._by_tag: Counter[tuple[str, str]] = Counter()
        self._waiting: deque[_Job] = deque()
        self._loop = asyncio.new_event_loop()
        self._session: aiohttp.ClientSession | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="eagle-synth-inflight", daemon=True)
        self._thread.start()
        self._ready.wait()

    def submit_many(
        self,
        *,
        prompts: list[tuple[list[int], ServerSampling]],
        timeout: float,
        tag: str,
        servers: frozenset[str] | None = None,
        prefixes: list[str | None] | None = None,
    ) -> list[Future]:
        """Queue (ids, sampling) prompts with one wake-up of the event loop; one future per prompt,
        in order. `servers`: the only servers they may go to (default: any); `prefixes`: each
        prompt's prefix key (workers/affinity.py; default: none)."""
        keys = prefixes if prefixes is not None else [None] * len(prompts)
        jobs = [
            _Job(ids=ids, sampling=sampling, timeout=timeout, tag=tag, future=Future(), servers=servers, prefix=prefix)
            for (ids, sampling), prefix in zip(prompts, keys, strict=True)
        ]
        if jobs:
            self._loop.call_soon_threadsafe(self._enqueue_all, jobs)
        return [job.future for job in jobs]

    def routable(self, among: frozenset[str] | None = None) -> bool:
        """True if some server (of `among`, default any) may take prompts now."""
        return any(
            self._limits.get(url, 0) > 0 and url not in self._refused and url in self._backends
            for url in self.servers
            if among is None or url in among
        )

    def waiting(self) -> int:
        return len(self._waiting)

    def tickets(self) -> int:
        """Tickets of the servers prompts may go to now (workers/reservation.py reads it)."""
        return sum(
            self._limits.get(url, 0) for url in self.servers if url not in self._refused and url in self._backends
        )

    def free_tickets(self) -> int:
        """Tickets of those servers no prompt holds."""
        return sum(self._free_servers().values())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CLOSE_TIMEOUT)

    async def _open(self) -> None:
        self._session = aiohttp.ClientSession(
            # Tickets bound concurrency; the connector must not add a second, smaller limit.
            connector=aiohttp.TCPConnector(limit=0),
            # GPU hosts talk to their servers directly; no proxy or .netrc lookups per request.
            trust_env=False,
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._open())
        self._loop.create_task(self._ticker())
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            if self._session is not None:
                self._loop.run_until_complete(self._session.close())
            self._loop.close()

    async def _ticker(self) -> None:
        while True:
            try:
                routes = await asyncio.to_thread(self._on_tick, dict(self._by_tag))
            except Exception:  # a Redis blip must not stop routing; keep the last limits
                log.warning("in-flight pool: routing refresh failed", exc_info=True)
            else:
                limits = {}
                for url in self.servers:
                    route = routes.get(url, Route(0))
                    if route.backend is not None:
                        # Learned at preflight; it may change when another server takes the address.
                        self._backends[url] = route.backend
                    limits[url] = route.tickets
                self._limits = limits
                metrics.slots(limits)
                self._refused.clear()
                self._pump()
            await asyncio.sleep(TICK_INTERVAL)

    def _enqueue_all(self, jobs: list[_Job]) -> None:
        self._waiting.extend(jobs)
        self._pump()

    def _free_servers(self) -> dict[str, int]:
        """Free tickets of each routable server that has any."""
        free = {
            url: self._limits.get(url, 0) - self._busy[url]
            for url in self.servers
            if url not in self._refused and url in self._backends
        }
        return {url: tickets for url, tickets in free.items() if tickets > 0}

    def _pump(self) -> None:
        skipped: list[_Job] = []  # waiting prompts no free server may take, in their order
        while self._waiting and (free := self._free_servers()):
            job = self._waiting.popleft()
            # Among the job's servers with a free ticket: its prefix's, else the most free tickets.
            allowed = [url for url in free if job.servers is None or url in job.servers]
            if not allowed:
                skipped.append(job)
                continue
            if not job.future.set_running_or_notify_cancel():
                continue  # its batch gave it up (requeued or shutting down)
            if self._affinity is None:
                url = least_loaded(allowed, free)
            else:
                url = self._affinity.pick(job.tag, job.prefix, allowed, free)
            self._busy[url] += 1
            self._by_tag[(job.tag, url)] += 1
            metrics.request_sent(url)
            self._loop.create_task(self._send(url, job))
        self._waiting.extendleft(reversed(skipped))

    async def _send(self, url: str, job: _Job) -> None:
        backend = self._backends[url]
        sent_at = time.monotonic()
        try:
            answer = Answer(url=url, item=await self._post(url, backend, job, sent_at=sent_at), backend=backend)
        except ClientError as exc:
            answer = Answer(url=url, error=exc, backend=backend)
        except Exception as exc:  # never leave a batch waiting on a future that cannot resolve
            answer = Answer(url=url, error=TransientError(f"{url}: unexpected client error: {exc!r}"), backend=backend)
        finally:
            self._busy[url] -= 1
            self._by_tag[(job.tag, url)] -= 1
            if not self._by_tag[(job.tag, url)]:
                del self._by_tag[(job.tag, url)]
        metrics.request_ended(url, time.monotonic() - sent_at, answer.error)
        if isinstance(answer.error, ServerDown | Unauthorized):
            self._refused.add(url)
        job.future.set_result(answer)
        self._pump()

    async def _post(self, url: str, backend: Backend, job: _Job, *, sent_at: float) -> Any:
        """The decoded reply; raises a ClientError. `sent_at`: when the request was sent (monotonic)."""
        assert self._session is not None
        path, body = backend.request(job.ids, job.sampling)
        timeout = aiohttp.ClientTimeout(total=job.timeout, sock_connect=CONNECT_TIMEOUT)
        try:
            async with self._session.post(
                f"{url}{path}", data=_json_body(body, job.ids), headers=self._headers, timeout=timeout
            ) as response:
                metrics.first_byte(url, time.monotonic() - sent_at)
                raw = await response.read()
                status = response.status
        except AIOHTTP_ERRORS as exc:
            raise transport_error(exc, url=url, path=path, timeout=job.timeout) from None
        if (error := error_for_status(status, raw, path=path, url=url, sent_key=self._sends_key)) is not None:
            raise error
        try:
            return _json_reply(raw)
        except ValueError as exc:
            raise TransientError(f"{path} answered 200 with a body that is not JSON: {exc}") from None
