"""HTTP transport and lifecycle: load the tokenizer, wait out the startup delay, bind, serve.

Stdlib only: a ThreadingHTTPServer speaking HTTP/1.1 with keep-alive, one daemon thread per
connection, JSON in and out. Endpoint behaviour lives in `app.py` (SGLang's API) and
`vllm_api.py` (vLLM's, with --api vllm).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from eagle_synth.devserver.app import DevServerApp, Reply, json_reply
from eagle_synth.devserver.config import DevServerConfig
from eagle_synth.devserver.vllm_api import VllmApi
from eagle_synth.devserver.vocab import ModelVocab

log = logging.getLogger("eagle_synth.devserver")

# Idle keep-alive connections are closed after this long, like uvicorn (SGLang's server) does.
KEEPALIVE_TIMEOUT_S = 5.0
# Listen backlog: hundreds of clients connecting at once must queue, not be refused.
LISTEN_BACKLOG = 2048
# Largest request body accepted (a big batch of long prompts is a few MB).
MAX_BODY_BYTES = 512 * 1024 * 1024
# How often serve_forever checks for shutdown; bounds how long stop() and death take.
POLL_INTERVAL_S = 0.1
# Line printed (and flushed) once the port listens; tests and scripts wait for it.
LISTENING_LINE = "devserver listening on http://{host}:{port}"


@dataclass(frozen=True, slots=True)
class _Route:
    methods: frozenset[str]
    handler: str  # DevServerApp method name


ROUTES: dict[str, _Route] = {
    "/generate": _Route(frozenset({"POST", "PUT"}), "generate"),
    "/health": _Route(frozenset({"GET"}), "health"),
    "/health_generate": _Route(frozenset({"GET"}), "health"),
    "/model_info": _Route(frozenset({"GET"}), "model_info"),
    "/get_model_info": _Route(frozenset({"GET"}), "get_model_info"),
    "/server_info": _Route(frozenset({"GET"}), "server_info"),
    "/get_server_info": _Route(frozenset({"GET"}), "get_server_info"),
    "/v1/models": _Route(frozenset({"GET"}), "models"),
    "/flush_cache": _Route(frozenset({"GET", "POST"}), "flush_cache"),
    "/abort_request": _Route(frozenset({"POST", "PUT"}), "abort_request"),
    "/dev/stats": _Route(frozenset({"GET"}), "dev_stats"),
    "/dev/reset_stats": _Route(frozenset({"POST"}), "dev_reset_stats"),
}
# vLLM's endpoints with --api vllm (handlers are VllmApi methods); every other path is a 404.
VLLM_ROUTES: dict[str, _Route] = {
    "/v1/completions": _Route(frozenset({"POST"}), "completions"),
    "/health": _Route(frozenset({"GET"}), "health"),
    "/v1/models": _Route(frozenset({"GET"}), "models"),
    "/version": _Route(frozenset({"GET"}), "version"),
    "/server_info": _Route(frozenset({"GET"}), "server_info"),
    "/tokenize": _Route(frozenset({"POST"}), "tokenize"),
    "/dev/stats": _Route(frozenset({"GET"}), "dev_stats"),
    "/dev/reset_stats": _Route(frozenset({"POST"}), "dev_reset_stats"),
}


class _Handler(BaseHTTPRequestHandler):
    """One connection: routes each request to the app and writes (or drops) the reply."""

    protocol_version = "HTTP/1.1"
    server_version = "eagle-synth-devserver"
    sys_version = ""
    # Headers and body go out in separate writes; without this Nagle + delayed ACK add ~40 ms.
    disable_nagle_algorithm = True
    timeout = KEEPALIVE_TIMEOUT_S
    app: DevServerApp  # set on the per-server subclass
    routes: dict[str, _Route]  # ROUTES or VLLM_ROUTES, per --api
    endpoints: object  # the object whose methods the routes name: the app, or its VllmApi

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        app = self.app
        if app.dead:
            self._drop()
            return
        body = self._read_body()
        if body is None:
            self._send(json_reply({"detail": "Request body too large"}, status=413))
            self.close_connection = True
            return
        path = urlsplit(self.path).path.rstrip("/") or "/"
        route = self.routes.get(path)
        if route is None:
            reply = json_reply({"detail": "Not Found"}, status=404)
        elif method not in route.methods:
            reply = json_reply({"detail": "Method Not Allowed"}, status=405)
        else:
            try:
                reply = getattr(self.endpoints, route.handler)(body)
            except Exception:
                log.exception("%s %s failed", method, path)
                reply = Reply(status=500, body=b"Internal Server Error", content_type="text/plain")
        if reply.drop or app.dead:
            self._drop()
        else:
            self._send(reply)
        if reply.die_reason is not None:
            app.die(reply.die_reason)

    def _read_body(self) -> bytes | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            return None
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        if reply.trickle:
            try:
                for index in range(len(reply.body)):
                    self.wfile.write(reply.body[index : index + 1])
                    self.wfile.flush()
                    time.sleep(reply.trickle)
            except OSError:
                self.close_connection = True  # the client gave up: what a deadline does
            return
        if reply.body:
            self.wfile.write(reply.body)

    def _drop(self) -> None:
        """Close the connection with no response at all (the client sees a disconnect)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        if self.app.config.access_log:
            super().log_message(format, *args)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request, client_address) -> None:
        # Clients that hang up mid-reply are routine under fault tests and benchmarks.
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


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
        self._httpd: _HTTPServer | None = None
        self._stop_requested = threading.Event()

    @property
    def port(self) -> int:
        """The bound port (meaningful once `listening` is set)."""
        return self._httpd.server_address[1] if self._httpd is not None else self.config.port

    @property
    def url(self) -> str:
        """Base URL of the server, e.g. http://127.0.0.1:30000."""
        return f"http://{self.config.host}:{self.port}"

    def run(self) -> None:
        """Load, delay, bind and serve; returns after `stop()` or an in-process death."""
        try:
            self._run()
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.stopped.set()
            self.listening.set()  # release waiters even when start failed

    def _run(self) -> None:
        c = self.config
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
        self.app = DevServerApp(config=c, vocab=vocab, on_death=self._on_death)
        if c.startup_delay > 0:
            log.info("devserver startup delay: port closed for %.1fs", c.startup_delay)
            if self._stop_requested.wait(c.startup_delay):
                return
        endpoints: object
        if c.api == "vllm":
            routes, endpoints = VLLM_ROUTES, VllmApi(self.app)
        else:
            routes, endpoints = ROUTES, self.app
        handler = type("DevServerHandler", (_Handler,), {"app": self.app, "routes": routes, "endpoints": endpoints})
        self._httpd = _HTTPServer((c.host, c.port), handler)
        self.app.mark_listening()
        print(LISTENING_LINE.format(host=c.host, port=self.port), flush=True)
        self.listening.set()
        if c.warmup > 0:
            log.info("devserver warm-up: health answers 503 for %.1fs", c.warmup)
        try:
            self._httpd.serve_forever(poll_interval=POLL_INTERVAL_S)
        finally:
            self._httpd.server_close()

    def stop(self) -> None:
        """Stop serving (from another thread) and fail whatever is still generating."""
        self._stop_requested.set()
        if self.app is not None:
            self.app.scheduler.kill_all()
        if self._httpd is not None and self.listening.is_set():
            self._httpd.shutdown()
        self.stopped.wait(timeout=10)

    def _on_death(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        if self.config.exit_on_death:
            # The process is about to exit; close the listener so nothing more is accepted.
            httpd.socket.close()
            return
        # In-process: shutdown() blocks until serve_forever returns, so not on a handler's back.
        threading.Thread(target=httpd.shutdown, name="devserver-death", daemon=True).start()


def run_devserver(config: DevServerConfig) -> None:
    """Run a devserver in the calling thread until interrupted (Ctrl-C) or it dies."""
    server = DevServer(config)
    try:
        server.run()
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
    thread = threading.Thread(target=_run_quietly, args=(server,), name="devserver", daemon=True)
    thread.start()
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


__all__ = [
    "DevServer",
    "run_devserver",
    "start_devserver_thread",
    "wait_listening",
    "ROUTES",
    "VLLM_ROUTES",
    "LISTENING_LINE",
]
