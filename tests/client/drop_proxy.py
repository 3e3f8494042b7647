"""A TCP proxy that loses the first responses: for the first ``num_drops`` connections it forwards the
request to the real server, then closes both sides as soon as the server's first response bytes arrive
(the client sees the connection reset with no response: the request ran, its answer was lost). Later
connections pass through. For the client's retry tests against a running gateway."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class ResponseDropProxy:
    """Listens on 127.0.0.1:<port> in its own thread; ``num_connections`` counts the connections seen."""

    def __init__(self, target_port: int, num_drops: int) -> None:
        self._target_port = target_port
        self._drops_left = num_drops
        self.num_connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="drop-proxy", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.num_connections += 1
        drop = self._drops_left > 0
        self._drops_left -= int(drop)
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self._target_port)
        try:
            upstream = asyncio.ensure_future(_pipe(client_r, server_w))
            if drop:
                await server_r.read(1)  # the response started: lose it
                client_w.transport.abort()  # a reset, not a clean end the client could mistake for one
                server_w.transport.abort()
                upstream.cancel()
            else:
                await asyncio.gather(upstream, _pipe(server_r, client_w))
        except OSError:
            pass
        finally:
            for writer in (client_w, server_w):
                with contextlib.suppress(Exception):
                    writer.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()
