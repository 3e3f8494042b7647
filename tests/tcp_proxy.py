"""A TCP proxy a test can cut and restore, to play a network outage between a client and a real server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
        except asyncio.CancelledError:
            # NOTE: cut() ends it; ending normally keeps asyncio's stream callback from logging the
            # cancellation as an error (which would read as a line of the service under test)
            pass
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


class ProxyThread:
    """A ``TcpProxy`` on its own event loop in a thread, for a test whose server (a gateway under uvicorn)
    runs in another thread: ``cut`` and ``restore`` block until done."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._thread.start()
        self.proxy = TcpProxy(target_host, target_port)
        self.port = self._run(self.proxy.start())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def cut(self) -> None:
        self._run(self.proxy.cut())

    def restore(self) -> None:
        self._run(self.proxy.restore())

    def close(self) -> None:
        self.cut()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
