"""A stub HTTP server (named as such: not the gateway) that answers each request with the next scripted
reply, for the client's wire-level tests: exact retry-after timings, dropped connections, error events
mid-stream, and seeing a client hang up. It records every request (headers, body, arrival time)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reply:
    """A whole response."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Drop:
    """Read the request, then close the connection without a response."""


@dataclass(frozen=True)
class Sse:
    """A 200 event stream: each of ``events`` as ``data: <json or literal>``, then ``end``: ``"done"``
    (``[DONE]`` and close), ``"close"`` (close without ``[DONE]``) or ``"hang"`` (keep the connection
    open until the client closes it)."""

    events: list[Any]
    end: str = "done"


Script = Reply | Drop | Sse


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: dict[str, Any] | None
    at_s: float  # time.monotonic() when its headers arrived


def chat_chunk(text: str, finish_reason: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish_reason}
    return {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "choices": [choice]}


def chat_completion(text: str) -> dict[str, Any]:
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    return {"id": "chatcmpl-stub", "object": "chat.completion", "choices": [choice], "usage": usage}


def error_body(code: str, message: str = "stub error") -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": code}}


class StubGateway:
    """Serves on 127.0.0.1:<port> from its own thread; ``script(...)`` sets the replies, in order."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.arrived = threading.Event()  # a request arrived since the last ``script``
        self.hung_up = threading.Event()  # the client closed a connection a "hang" stream held open
        self._replies: list[Script] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stub-gateway", daemon=True)
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def script(self, *replies: Script) -> None:
        self.seen.clear()
        self.arrived.clear()
        self.hung_up.clear()
        self._replies = list(replies)

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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            headers = dict(
                (name.strip().lower(), value.strip())
                for name, _, value in (line.partition(":") for line in header_lines if line)
            )
            raw = await reader.readexactly(int(headers.get("content-length", "0")))
            method, path, _ = request_line.split(" ", 2)
            body = json.loads(raw) if raw else None
            self.seen.append(Seen(method, path, headers, body, time.monotonic()))
            self.arrived.set()
            reply = self._replies.pop(0) if self._replies else Reply(418, error_body("script_exhausted"))
            await self._answer(reply, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(
        self, reply: Script, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if isinstance(reply, Drop):
            return
        if isinstance(reply, Reply):
            content = json.dumps(reply.body).encode()
            head = {"Content-Type": "application/json", "Content-Length": str(len(content)), **reply.headers}
            writer.write(_head(reply.status, head) + content)
            await writer.drain()
            return
        writer.write(_head(200, {"Content-Type": "text/event-stream", "X-Request-Id": "req-stub"}))
        for event in reply.events:
            data = event if isinstance(event, str) else json.dumps(event)
            writer.write(f"data: {data}\n\n".encode())
            await writer.drain()
        if reply.end == "done":
            writer.write(b"data: [DONE]\n\n")
        elif reply.end == "hang":
            await writer.drain()
            await reader.read()  # returns at EOF: the client hung up
            self.hung_up.set()
        await writer.drain()


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} Stub", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
