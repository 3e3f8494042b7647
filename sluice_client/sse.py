"""Server-sent events, as the gateway streams completions: an incremental decoder (text in, events out, in
whatever pieces the network delivers) and the reading of one event's data as a chunk, an error or the end.

One parser for the sync and async clients. It follows the SSE rules the gateway relies on: ``data:`` lines
(several join with newlines), an event ends at a blank line, ``:`` starts a comment, CR, LF and CRLF all
end a line, and an event not yet ended when the stream stops is dropped.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from sluice_client.errors import StreamError

DONE = "[DONE]"
CONNECTION_LOST = "connection_lost"  # StreamError.code when the connection dies mid-stream


class SseDecoder:
    """Feed it text as it arrives; it returns the ``data`` of each event completed so far."""

    def __init__(self) -> None:
        self._line = ""  # the current line, not yet ended
        self._data: list[str] = []  # the current event's data lines
        self._after_cr = False  # the last piece ended in CR: a leading LF ends nothing more

    def feed(self, text: str) -> list[str]:
        events: list[str] = []
        for char in text:
            if char == "\n" and self._after_cr:
                self._after_cr = False
                continue
            self._after_cr = char == "\r"
            if char in "\r\n":
                self._end_line(events)
            else:
                self._line += char
        return events

    def _end_line(self, events: list[str]) -> None:
        line, self._line = self._line, ""
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        # other fields (event, id, retry) carry nothing the completion stream uses


@dataclass(frozen=True)
class Chunk:
    """One streamed ``chat.completion.chunk`` or ``text_completion`` event: the decoded ``body``, and its
    first choice's new ``text`` and ``finish_reason`` (``usage`` on the closing usage chunk)."""

    body: dict[str, Any]
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None


@dataclass(frozen=True)
class ErrorEvent:
    """A ``data: {"error": {...}}`` event: the stream failed (or its output was filtered) after tokens."""

    message: str
    code: str | None
    type: str | None


def read_event(data: str) -> Chunk | ErrorEvent | None:
    """The event's meaning: a chunk, an error, or None for ``[DONE]`` (the stream's normal end). Data that
    is not a JSON object reads as an error event (code ``invalid_event``), never as silence."""
    if data == DONE:
        return None
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return ErrorEvent(f"the stream sent an event that is not a JSON object: {data[:200]!r}",
                          "invalid_event", None)  # fmt: skip
    error = body.get("error")
    if error is not None:
        error = error if isinstance(error, dict) else {"message": str(error)}
        return ErrorEvent(str(error.get("message") or "stream error"), _str(error.get("code")),
                          _str(error.get("type")))  # fmt: skip
    return chunk_of(body)


def chunk_of(body: dict[str, Any]) -> Chunk:
    """A chunk body's first choice: chat chunks carry ``delta.content``, completion chunks ``text``."""
    choices = body.get("choices") or []
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    delta = first.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else first.get("text")
    usage = body.get("usage")
    return Chunk(
        body=body,
        text=text if isinstance(text, str) else "",
        finish_reason=_str(first.get("finish_reason")),
        usage=usage if isinstance(usage, dict) else None,
    )


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


class StreamReader:
    """A completion stream's state, for the sync and async streams alike: text in (``feed``), chunks out
    (``next_chunk``), the text received so far (``text``), and the ``StreamError`` to raise when the
    stream fails (an error event, or ``lost`` when the connection ends before ``[DONE]``)."""

    def __init__(self, request_id: str | None, idempotency_key: str | None) -> None:
        self.request_id = request_id
        self.idempotency_key = idempotency_key
        self.text = ""
        self.done = False  # [DONE] seen
        self._decoder = SseDecoder()
        self._pending: deque[str] = deque()

    def feed(self, piece: str) -> None:
        self._pending.extend(self._decoder.feed(piece))

    def has_event(self) -> bool:
        return bool(self._pending)

    def next_chunk(self) -> Chunk | None:
        """The next chunk, or None when none is complete yet or the stream ended (``done``). Raises
        ``StreamError`` for an error event."""
        while self._pending and not self.done:
            event = read_event(self._pending.popleft())
            if event is None:
                self.done = True
            elif isinstance(event, ErrorEvent):
                raise self._error(event.message, event.code)
            else:
                self.text += event.text
                return event
        return None

    def lost(self, cause: BaseException | None) -> StreamError:
        """The error for a stream whose connection ended (``cause``: the transport error, if any) before
        ``[DONE]``."""
        why = f"the connection was lost mid-stream ({type(cause).__name__}: {cause})" if cause else (
            "the stream ended before [DONE]")  # fmt: skip
        return self._error(why, CONNECTION_LOST)

    def _error(self, message: str, code: str | None) -> StreamError:
        return StreamError(
            message,
            code=code,
            partial_text=self.text,
            request_id=self.request_id,
            idempotency_key=self.idempotency_key,
        )
