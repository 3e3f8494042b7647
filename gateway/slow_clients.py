"""Connections that hold the gateway without doing their part: a client that stops reading, one that
never finishes sending its request head, one whose head never ends.

The server only learns that a client stopped reading through back-pressure: the kernel's send buffer
fills, then the transport's write buffer passes its high-water mark and the protocol is paused (uvicorn's
``send`` then waits in ``drain``). So each connection gets a bounded kernel send buffer and transport
write buffer (``client_send_buffer_bytes``), which makes that pause come after a bounded amount of unread
output, and a write deadline: paused for ``client_write_timeout_s`` without resuming, the connection is
aborted. uvicorn then reports ``http.disconnect``, and the request ends the way any client disconnect
does (the stream cancelled; its one ``finally`` cancels the engine call, frees the slot and meters what
was produced, outcome cancelled).

A request head (request line and headers) must arrive within ``client_header_timeout_s`` of the
connection opening or of the request's first byte (408, closed), and stay under
``max_request_head_bytes`` (431, closed): httptools itself bounds neither.

Past the per-process connection limit (uvicorn's ``limit_concurrency``), a request gets 503 in the API's
error shape (code ``gateway_connection_limit``) with ``Retry-After``, not uvicorn's plain-text page.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from gateway.errors import OpenAIError

log = logging.getLogger("sluice.gateway.clients")


@dataclass(frozen=True)
class ClientLimits:
    write_timeout_s: float
    send_buffer_bytes: int
    header_timeout_s: float
    max_head_bytes: int


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing (httptools re-raises it as a parser error)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above. Use ``guarded_protocol(limits)``, which binds
    ``limits``; one instance per connection, on the event loop only."""

    limits: ClassVar[ClientLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_deadline: asyncio.TimerHandle | None = None
        self._head_deadline: asyncio.TimerHandle | None = None
        self._num_head_bytes = 0
        self._head_too_large = False

    # ----- connection -----
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # NOTE: a fixed SO_SNDBUF also turns off the kernel's autotuning, which would otherwise grow
            # the buffer to megabytes for a client that reads nothing.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)
        transport.set_write_buffer_limits(high=self.limits.send_buffer_bytes)
        self._arm_head_deadline()  # a connection that never sends a request is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_write_deadline()
        self._cancel_head_deadline()
        super().connection_lost(exc)

    # ----- the write deadline -----
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.limits.write_timeout_s, self._write_timed_out)

    def resume_writing(self) -> None:
        self._cancel_write_deadline()
        super().resume_writing()

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        log.info(
            "client %s read nothing for %.0f s with output waiting: connection closed, its request cancelled",
            _address(self.client),
            self.limits.write_timeout_s,
        )
        # A reset, not a close: a close would wait to flush a buffer the client is not reading (the
        # transport's, then the kernel's, for minutes), and the client could take the cut for an end.
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _cancel_write_deadline(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    # ----- the request head -----
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._num_head_bytes = 0
        self._arm_head_deadline()

    def on_url(self, url: bytes) -> None:
        self._count_head_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head_bytes(len(name) + len(value) + 4)  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_deadline()
        super().on_headers_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # NOTE: past limit_concurrency uvicorn runs its plain-text 503 app: answer in the API's shape.
        super()._start_asgi_task(cycle, _over_capacity if app is service_unavailable else app)

    def _count_head_bytes(self, num_bytes: int) -> None:
        self._num_head_bytes += num_bytes
        if self._num_head_bytes > self.limits.max_head_bytes:
            self._head_too_large = True
            raise _HeadTooLarge

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers any parser error with 400; the one raised above is a 431.
        if self._head_too_large:
            self._refuse(431, "Request header fields too large")
        else:
            super().send_400_response(msg)

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is None:
            self._head_deadline = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head trickling in behind a response being sent: no room for a 408 there.
            self.transport.abort()
            return
        self._refuse(408, "Request head not received in time")

    def _refuse(self, status_code: int, message: str) -> None:
        body = message.encode("ascii")
        self.transport.write(
            b"".join(
                [
                    STATUS_LINE[status_code],
                    b"content-type: text/plain; charset=utf-8\r\n",
                    b"content-length: %d\r\n" % len(body),
                    b"connection: close\r\n\r\n",
                    body,
                ]
            )
        )
        self.transport.close()


_OVER_CAPACITY = OpenAIError(
    503,
    "This gateway is at its connection limit; retry shortly.",
    type="server_error",
    code="gateway_connection_limit",
    retry_after_s=1.0,
)


async def _over_capacity(scope: Any, receive: Any, send: Any) -> None:
    """The answer past the per-process connection limit: the OpenAI error shape and a Retry-After, so the
    official SDKs back off and retry."""
    body = json.dumps(_OVER_CAPACITY.body()).encode()
    headers = [(name.lower().encode(), value.encode()) for name, value in _OVER_CAPACITY.headers().items()]
    await send(
        {
            "type": "http.response.start",
            "status": _OVER_CAPACITY.status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})


def guarded_protocol(limits: ClientLimits) -> type[GuardedHttpToolsProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``), with ``limits`` bound."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


def _address(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "?"
