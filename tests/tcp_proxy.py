"""A TCP proxy a test can cut and restore, to play a network outage between a client and a real server."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target``. ``cut()`` closes the listener and every live connection
    (clients see resets, then refused connections); ``restore()`` listens again on the same port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def restore(self) -> None:
        await self.start()

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self._target)
            self._writers.add(server_w)
            await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))
        except OSError:
            pass  # a reset from either side ends the connection
        finally:
            client_w.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()
