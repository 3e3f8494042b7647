"""Redis failures a test cannot get from the shared server (which must never be reconfigured):

- ``FaultyRedis``: a named fake speaking just enough RESP on loopback for a redis-py client to connect
  (PING, CLIENT, SELECT, SCRIPT LOAD), answering every other command (the scripts) with one chosen error
  reply, as a server out of memory, a read-only replica, or one loading or failing over would; or, with
  ``None``, never answering them (a hung server).
- ``ReplyFaultProxy``: a TCP proxy in front of the real Redis that can lose the next reply after Redis ran
  the command (closing the client's connection instead), or hold replies back (a Redis that answers late).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import socketserver
import threading
from typing import Any

# Error replies as servers send them.
OOM = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
READONLY = b"-READONLY You can't write against a read only replica.\r\n"
LOADING = b"-LOADING Redis is loading the dataset in memory\r\n"
MASTERDOWN = b"-MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.\r\n"
CLUSTERDOWN = b"-CLUSTERDOWN The cluster is down\r\n"
TRYAGAIN = b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n"
BUSY = b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n"
MISCONF = (
    b"-MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.\r\n"
)
NOREPLICAS = b"-NOREPLICAS Not enough good replicas to write.\r\n"
# A failed write inside a script: Redis 7 keeps the code first; servers before 7 wrap it in an ERR.
OOM_IN_SCRIPT = (
    b"-OOM command not allowed when used memory > 'maxmemory'. script: 1f0e, on @user_script:12.\r\n"
)
OOM_IN_SCRIPT_BEFORE_7 = (
    b"-ERR Error running script (call to f_1f0e): @user_script:12: @user_script: 12: "
    b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
)
# Not an outage: our own mistakes, which must not be hidden by failing open.
WRONGTYPE = b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n"
SCRIPT_BUG = b"-ERR user_script:3: Script attempted to access nonexistent global variable 'x'\r\n"


def _read_command(rfile: io.BufferedIOBase) -> list[bytes] | None:
    """One RESP command (an array of bulk strings); None when the client closed the connection."""
    line = rfile.readline()
    if not line:
        return None
    if not line.startswith(b"*"):
        raise ValueError(f"not a RESP array: {line!r}")
    args = []
    for _ in range(int(line[1:])):
        header = rfile.readline()
        args.append(rfile.read(int(header[1:]) + 2)[:-2])
    return args


class FaultyRedis:
    """A fake Redis on 127.0.0.1 (its own thread, so any event loop or none can use it): ``reply`` (a whole
    RESP error line) answers every command but PING, CLIENT, SELECT and SCRIPT LOAD; ``None`` answers
    none of those (hung). Counts the commands it refused or ignored in ``num_refused``."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.num_refused = 0
        self.port = 0
        self.url = ""
        self._server: socketserver.ThreadingTCPServer | None = None
        self._thread: threading.Thread | None = None

    async def start(self) -> None:
        self.serve()

    async def close(self) -> None:
        self.stop()

    def serve(self) -> None:
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with contextlib.suppress(OSError, ValueError):
                    while (command := _read_command(self.rfile)) is not None:
                        answer = fake.answer(command)
                        if answer is not None:
                            self.wfile.write(answer)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="faulty-redis", daemon=True
        )  # NOTE: the poll interval is how long stop() takes
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = self._thread = None

    def answer(self, command: list[bytes]) -> bytes | None:
        name = command[0].upper()
        if name == b"PING":
            return b"+PONG\r\n"
        if name in (b"CLIENT", b"SELECT"):
            return b"+OK\r\n"
        if name == b"SCRIPT" and len(command) > 2 and command[1].upper() == b"LOAD":
            sha = hashlib.sha1(command[2]).hexdigest().encode()
            return b"$%d\r\n%s\r\n" % (len(sha), sha)
        self.num_refused += 1
        return self.reply


class ReplyFaultProxy:
    """Forwards 127.0.0.1:<port> to a real Redis, on the caller's event loop. ``drop_next_reply()``: the
    next reply from Redis is not delivered and the client's connection is closed instead (Redis has run
    the command; the client cannot know). ``hold_replies()`` / ``release_replies()``: replies wait."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self._target = (target_host, target_port)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._passing = asyncio.Event()
        self._passing.set()
        self._drop_next = False
        self.num_dropped = 0
        self.port = 0

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def drop_next_reply(self) -> None:
        self._drop_next = True

    def hold_replies(self) -> None:
        self._passing.clear()

    def release_replies(self) -> None:
        self._passing.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        server_r, server_w = await asyncio.open_connection(*self._target)

        async def upstream() -> None:
            while data := await client_r.read(65536):
                server_w.write(data)
                await server_w.drain()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                await self._passing.wait()
                if self._drop_next:
                    self._drop_next = False
                    self.num_dropped += 1
                    return  # the reply is lost: both connections close below
                client_w.write(data)
                await client_w.drain()

        up = asyncio.ensure_future(upstream())
        down = asyncio.ensure_future(downstream())
        try:
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # close(): end quietly (a cancelled handler task is reported by asyncio's streams)
        finally:
            up.cancel()
            down.cancel()
            await asyncio.gather(up, down, return_exceptions=True)
            for writer in (client_w, server_w):
                with contextlib.suppress(Exception):
                    writer.close()
            self._tasks.discard(task)
