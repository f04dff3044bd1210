"""A TCP forwarder: a port that pipes every connection, byte for byte, to another server's port.

The real-vLLM kill test uses it to bring "the server" back at the port the worker was given
without a second cold start of vLLM (2-5 minutes of 2 cores): the comeback is the session's
own real vLLM server behind this port, so what the worker talks to is still vLLM, unaltered.
The Sentinel failover test gives it a `delay`: a replica behind it lags its master by that much.
"""

from __future__ import annotations

import asyncio
import threading
import time

# Bytes read from one side before they are written to the other.
CHUNK = 64 * 1024


class TcpForward:
    """Listens on 127.0.0.1:`port` and forwards each connection to 127.0.0.1:`target_port`.

    Runs its own event loop in a daemon thread; `close()` stops listening and drops every
    connection. Parameters:
        port: the port to listen on (the one the worker was given).
        target_port: the port of the real server behind it.
        delay: seconds each chunk the server sends is held before it is passed on (order kept),
            on a connection whose client sent `delay_after` (Redis's PSYNC: a replica's link,
            while clients and sentinels pass at once); when the server ends, what is held is
            dropped, as a dead master's stream in flight on a lagging link would be.
    """

    def __init__(self, port: int, target_port: int, *, delay: float = 0.0, delay_after: bytes = b"") -> None:
        self.port, self.target_port = port, target_port
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
        lagging = [not self.delay_after]  # this connection's server stream is delayed
        await asyncio.gather(
            self._pipe(client_reader, server_writer, lagging, watch=True),
            self._pipe(server_reader, client_writer, lagging, watch=False),
        )

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lagging: list[bool], *, watch: bool
    ) -> None:
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        passing = asyncio.ensure_future(self._pass_on(held, writer))
        try:
            while chunk := await reader.read(CHUNK):
                if watch and self.delay_after and self.delay_after in chunk:
                    lagging[0] = True
                delay = self.delay if lagging[0] and not watch else 0.0
                held.put_nowait((time.monotonic() + delay, chunk))
        except OSError:
            pass
        finally:
            if self.delay and lagging[0] and not watch:
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

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
