"""HTTP transport and lifecycle: load the tokenizer, wait out the startup delay, bind, serve.

aiohttp.web on an event loop of its own (the main thread, or a daemon thread in-process).
Endpoint methods block (a /generate holds its slot for the emulated time), so each runs in a
pool thread: a waiting request costs one thread, as a thread-per-connection server did.
Endpoint behaviour lives in `app.py` (SGLang's API) and `vllm_api.py` (vLLM's, with --api vllm).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from aiohttp import web

from eagle_synth.devserver.app import DevServerApp, Reply, json_reply
from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.devserver.vllm_api import VllmApi
from eagle_synth.devserver.vocab import ModelVocab

log = logging.getLogger("eagle_synth.devserver")

# Idle keep-alive connections are closed after this long, like uvicorn (SGLang's server) does.
KEEPALIVE_TIMEOUT_S = 5.0
# Listen backlog: hundreds of clients connecting at once must queue, not be refused.
LISTEN_BACKLOG = 2048
# Requests blocked in endpoint methods at once (threads start on demand, up to this many).
HANDLER_THREADS = 4096
# Largest request body accepted (a big batch of long prompts is a few MB).
MAX_BODY_BYTES = 512 * 1024 * 1024
# Seconds stop() gives unfinished replies (a trickling /health) before closing them.
SHUTDOWN_TIMEOUT_S = 1.0
# Line printed (and flushed) once the port listens; tests and scripts wait for it.
LISTENING_LINE = "devserver listening on http://{host}:{port}"

# path -> (methods, endpoint method name): a method of the app, or with --api vllm of its
# VllmApi (falling back to the app's for the shared ones: /health, /dev/stats).
ROUTES: dict[str, tuple[frozenset[str], str]] = {
    "/generate": (frozenset({"POST", "PUT"}), "generate"),
    "/health": (frozenset({"GET"}), "health"),
    "/health_generate": (frozenset({"GET"}), "health"),
    "/model_info": (frozenset({"GET"}), "model_info"),
    "/get_model_info": (frozenset({"GET"}), "get_model_info"),
    "/server_info": (frozenset({"GET"}), "server_info"),
    "/get_server_info": (frozenset({"GET"}), "get_server_info"),
    "/v1/models": (frozenset({"GET"}), "models"),
    "/flush_cache": (frozenset({"GET", "POST"}), "flush_cache"),
    "/abort_request": (frozenset({"POST", "PUT"}), "abort_request"),
    "/dev/stats": (frozenset({"GET"}), "dev_stats"),
    "/dev/reset_stats": (frozenset({"POST"}), "dev_reset_stats"),
}
# vLLM's endpoints with --api vllm; every other path is a 404.
VLLM_ROUTES: dict[str, tuple[frozenset[str], str]] = {
    "/v1/completions": (frozenset({"POST"}), "completions"),
    "/health": (frozenset({"GET"}), "health"),
    "/v1/models": (frozenset({"GET"}), "models"),
    "/version": (frozenset({"GET"}), "version"),
    "/server_info": (frozenset({"GET"}), "server_info"),
    "/tokenize": (frozenset({"POST"}), "tokenize"),
    "/dev/stats": (frozenset({"GET"}), "dev_stats"),
    "/dev/reset_stats": (frozenset({"POST"}), "dev_reset_stats"),
}


class DevServer:
    """One devserver instance and its lifecycle.

    Behaviour: `run()` loads the tokenizer, keeps the port closed for `startup_delay` seconds,
    binds, prints LISTENING_LINE and serves until `stop()` or death. Usable from the main
    thread (`run_devserver`) or a background thread (`start_devserver_thread`).

    Parameters:
        config: launch arguments.
        vocab: an already loaded token space (saves the tokenizer load in tests); None loads
            it from config.tokenizer in `run()`.
    """

    def __init__(self, config: DevServerConfig, *, vocab: ModelVocab | None = None) -> None:
        self.config = config
        self.app: DevServerApp | None = None
        self.listening = threading.Event()
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self._vocab = vocab
        self._port = config.port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self._pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="devserver")

    @property
    def port(self) -> int:
        """The bound port (meaningful once `listening` is set)."""
        return self._port

    @property
    def url(self) -> str:
        """Base URL of the server, e.g. http://127.0.0.1:30000."""
        return f"http://{self.config.host}:{self.port}"

    def run(self) -> None:
        """Load, delay, bind and serve; returns after `stop()` or an in-process death."""
        try:
            asyncio.run(self._run())
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self.stopped.set()
            self.listening.set()  # release waiters even when start failed

    async def _run(self) -> None:
        c = self.config
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        if self._stop_requested.is_set():
            return
        t0 = time.monotonic()
        vocab = self._vocab or ModelVocab.load(tokenizer_dir=c.tokenizer, vocab_size=c.vocab_size)
        log.info(
            "devserver loaded tokenizer %s in %.1fs: vocab %d, eos %s, think %s/%s, corpus %d tokens",
            c.tokenizer,
            time.monotonic() - t0,
            vocab.size,
            vocab.eos_id,
            vocab.think_open_id,
            vocab.think_close_id,
            len(vocab.corpus_ids),
        )
        self.app = DevServerApp(config=c, vocab=vocab, on_death=self._request_stop)
        if c.startup_delay > 0:
            log.info("devserver startup delay: port closed for %.1fs", c.startup_delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), c.startup_delay)
            if self._stop.is_set():
                return
        routes, endpoints = (VLLM_ROUTES, VllmApi(self.app)) if c.api == "vllm" else (ROUTES, self.app)
        handlers = {
            path: (methods, getattr(endpoints, name, None) or getattr(self.app, name))
            for path, (methods, name) in routes.items()
        }
        web_app = web.Application(client_max_size=MAX_BODY_BYTES)
        web_app.router.add_route("*", "/{path:.*}", partial(self._dispatch, handlers))
        runner = web.AppRunner(
            web_app,
            access_log=log if c.access_log else None,
            keepalive_timeout=KEEPALIVE_TIMEOUT_S,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        try:
            site = web.TCPSite(runner, c.host, c.port, backlog=LISTEN_BACKLOG, reuse_address=True)
            await site.start()
            self._port = runner.addresses[0][1]
            self.app.mark_listening()
            print(LISTENING_LINE.format(host=c.host, port=self.port), flush=True)
            self.listening.set()
            if c.warmup > 0:
                log.info("devserver warm-up: health answers 503 for %.1fs", c.warmup)
            await self._stop.wait()
        finally:
            await runner.cleanup()

    async def _dispatch(self, handlers: dict, request: web.Request) -> web.StreamResponse:
        app = self.app
        assert app is not None
        if app.dead:
            return _drop(request)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return await _send(request, json_reply({"detail": "Request body too large"}, status=413), close=True)
        path = request.path.rstrip("/") or "/"
        route = handlers.get(path)
        if route is None:
            reply = json_reply({"detail": "Not Found"}, status=404)
        elif request.method not in route[0]:
            reply = json_reply({"detail": "Method Not Allowed"}, status=405)
        else:
            try:
                reply = await asyncio.get_running_loop().run_in_executor(self._pool, route[1], body)
            except Exception:
                log.exception("%s %s failed", request.method, path)
                reply = Reply(status=500, body=b"Internal Server Error", content_type="text/plain")
        response = _drop(request) if reply.drop or app.dead else await _send(request, reply)
        if reply.die_reason is not None:
            app.die(reply.die_reason)  # after the reply went out: with exit_on_death it ends the process
        return response

    def _request_stop(self) -> None:
        self._stop_requested.set()
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                self._loop.call_soon_threadsafe(self._stop.set)

    def stop(self) -> None:
        """Stop serving (from another thread) and fail whatever is still generating."""
        self._request_stop()
        if self.app is not None:
            self.app.scheduler.kill_all()
        self.stopped.wait(timeout=10)


async def _send(request: web.Request, reply: Reply, *, close: bool = False) -> web.StreamResponse:
    """Write `reply` whole (or, with `trickle`, a byte at a time), flushed before returning."""
    response = web.StreamResponse(
        status=reply.status, headers={"Content-Type": reply.content_type, "Content-Length": str(len(reply.body))}
    )
    if close:
        response.force_close()
    await response.prepare(request)
    try:
        if not reply.trickle:
            await response.write(reply.body)
        else:
            for index in range(len(reply.body)):
                await response.write(reply.body[index : index + 1])
                await asyncio.sleep(reply.trickle)
        await response.write_eof()
    except ConnectionError:
        pass  # the client gave up (what a deadline does); aiohttp closes the connection
    return response


def _drop(request: web.Request) -> web.StreamResponse:
    """Close the connection with no response at all (the client sees a disconnect)."""
    if request.transport is not None:
        request.transport.close()
    return web.Response()  # its write fails on the closed transport, which aiohttp ignores


def run_devserver(config: DevServerConfig) -> None:
    """Run a devserver in the calling thread until interrupted (Ctrl-C) or it dies."""
    try:
        DevServer(config).run()
    except KeyboardInterrupt:
        log.info("devserver interrupted")


def start_devserver_thread(
    config: DevServerConfig,
    *,
    vocab: ModelVocab | None = None,
    wait: bool = True,
    timeout: float = 120.0,
) -> DevServer:
    """Start a devserver in a daemon thread and return it (call `.stop()` when done).

    Fatal faults (out-of-vocabulary id, --die-after) stop the server instead of exiting the
    host process. With `wait`, blocks until the port listens (raising the start error, or
    TimeoutError after `timeout` seconds); pass wait=False to observe a startup delay.
    """
    server = DevServer(config.replace(exit_on_death=False), vocab=vocab)
    threading.Thread(target=_run_quietly, args=(server,), name="devserver", daemon=True).start()
    if wait:
        wait_listening(server, timeout=timeout)
    return server


def wait_listening(server: DevServer, *, timeout: float) -> None:
    """Block until `server` listens; raise its start error or TimeoutError."""
    if not server.listening.wait(timeout):
        raise TimeoutError(f"devserver did not listen within {timeout}s")
    if server.error is not None:
        raise RuntimeError("devserver failed to start") from server.error
    if server.stopped.is_set() and server.app is None:
        raise RuntimeError("devserver stopped before listening")


def _run_quietly(server: DevServer) -> None:
    try:
        server.run()
    except BaseException:  # kept on server.error for wait_listening
        log.exception("devserver thread failed")
