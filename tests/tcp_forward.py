"""A TCP forwarder: a port that pipes every connection, byte for byte, to another server's port,
and can lose a chosen request or the reply to it, as a network does.

The real-vLLM kill test uses it to bring "the server" back at the port the worker was given
without a second cold start of vLLM (2-5 minutes of 2 cores): the comeback is the session's
own real vLLM server behind this port, so what the worker talks to is still vLLM, unaltered.
The lost-reply tests put it between a client and redis-server: a chunk the client sends that
`lose_reply` picks reaches Redis, which applies it, but the connection is cut before the reply
gets back; one `lose_request` picks never reaches Redis. The Sentinel failover test gives it a
`delay`: a replica behind it lags its master by that much.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

# Bytes read from one side before they are written to the other.
CHUNK = 64 * 1024

# Picks chunks (what the client sent in one read) to lose.
Picker = Callable[[bytes], bool]


def _never(_chunk: bytes) -> bool:
    return False


class _Connection:
    """One forwarded connection: its two writers, whether the reply in flight is to be lost, and
    whether what the server sends on it is delayed (`lagging`)."""

    def __init__(
        self, client_writer: asyncio.StreamWriter, server_writer: asyncio.StreamWriter, *, lagging: bool
    ) -> None:
        self.client_writer = client_writer
        self.server_writer = server_writer
        self.lose_reply = False
        self.lagging = lagging

    def cut(self) -> None:
        self.client_writer.close()
        self.server_writer.close()


class TcpForward:
    """Listens on 127.0.0.1:`port` and forwards each connection to 127.0.0.1:`target_port`.

    Runs its own event loop in a daemon thread; `close()` stops listening and drops every
    connection. Parameters:
        port: the port to listen on (the one the worker was given).
        target_port: the port of the real server behind it.
        lose_reply: picks client chunks to deliver whose reply is then dropped, the connection
            cut (called on the forwarder's thread; default none).
        lose_request: picks client chunks to drop, the connection cut (default none).
        delay: seconds each chunk the server sends is held before it is passed on (order kept),
            on a connection whose client sent `delay_after` (Redis's PSYNC: a replica's link,
            while clients and sentinels pass at once); when the server ends, what is held is
            dropped, as a dead master's stream in flight on a lagging link would be.
    """

    def __init__(
        self,
        port: int,
        target_port: int,
        *,
        lose_reply: Picker = _never,
        lose_request: Picker = _never,
        delay: float = 0.0,
        delay_after: bytes = b"",
    ) -> None:
        self.port = port
        self.target_port = target_port
        self.lose_reply = lose_reply
        self.lose_request = lose_request
        self.delay = delay
        self.delay_after = delay_after
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        threading.Thread(target=self._loop.run_forever, daemon=True, name=f"forward-{port}").start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            client_writer.close()
            return
        self._writers |= {client_writer, server_writer}
        connection = _Connection(client_writer, server_writer, lagging=not self.delay_after)
        await asyncio.gather(
            self._pipe(client_reader, server_writer, connection, upstream=True),
            self._pipe(server_reader, client_writer, connection, upstream=False),
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection, *, upstream: bool
    ) -> None:
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        passing = asyncio.ensure_future(self._pass_on(held, writer))
        try:
            while chunk := await reader.read(CHUNK):
                if upstream and self.delay_after and self.delay_after in chunk:
                    connection.lagging = True
                if upstream and self.lose_request(chunk):
                    connection.cut()
                    break
                if upstream and self.lose_reply(chunk):
                    connection.lose_reply = True  # set before the request leaves: its reply comes after
                elif not upstream and connection.lose_reply:
                    connection.cut()  # the server answered (so it applied the request); nobody hears it
                    break
                delay = self.delay if connection.lagging and not upstream else 0.0
                held.put_nowait((time.monotonic() + delay, chunk))
        except OSError:
            pass
        finally:
            if self.delay and connection.lagging and not upstream:
                passing.cancel()  # what a lagging link still holds dies with its sender
                self._writers.discard(writer)
                writer.close()
            else:
                held.put_nowait((time.monotonic(), b""))
                await passing

    async def _pass_on(self, held: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        """Write each chunk once its time came; an empty one ends the connection."""
        try:
            while True:
                due, chunk = await held.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()
        except OSError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            others = asyncio.all_tasks() - {asyncio.current_task()}
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
