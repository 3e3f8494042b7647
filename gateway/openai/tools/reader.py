"""The answer side of tool calls: ``ToolCallReader`` turns one choice's text, piece by piece, into content
and tool-call deltas (the package's docstring says how each mode and parser reads it)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.openai.schemas import ChoiceDeltaFunction, ChoiceDeltaToolCall, FunctionCall, ToolCall
from gateway.openai.tools.scan import CallScanner, Named, ObjectEnd
from sluice.tool_parsers import DEFAULT_PARSER, HERMES, PARSERS


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class ToolMode(StrEnum):
    NONE = "none"
    AUTO = "auto"
    REQUIRED = "required"
    NAMED = "named"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of call ``index`` (0, 1, ... in the order the calls were made): ``id`` and ``name`` on its
    first piece (whose ``arguments`` is ""), then fragments of its arguments' JSON text."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


Part = str | ToolCallDelta  # content text, or a piece of a tool call


def delta_tool_call(part: ToolCallDelta) -> ChoiceDeltaToolCall:
    """A part as a streamed chunk's ``delta.tool_calls`` entry (OpenAI's shape)."""
    return ChoiceDeltaToolCall(
        part.index,
        part.id,
        "function" if part.id is not None else None,
        ChoiceDeltaFunction(part.name, part.arguments),
    )


def read_whole(reader: ToolCallReader, text: str) -> tuple[str | None, list[ToolCall]]:
    """A non-streamed answer, read by a fresh ``reader``: its content (None when it is only calls) and
    its calls."""
    parts = reader.feed(text) + reader.finish()
    content = "".join(p for p in parts if isinstance(p, str))
    calls: list[ToolCall] = []
    for part in parts:
        if isinstance(part, ToolCallDelta):
            if part.id is not None:
                calls.append(ToolCall(id=part.id, function=FunctionCall(name=part.name or "", arguments="")))
            calls[part.index].function.arguments += part.arguments
    return (None if calls and not content else content), calls


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


class ToolCallReader:
    """One choice's text in, ``Part`` s out (``gateway.openai.tools``). ``feed`` each piece of text as it
    comes, then ``finish`` once; ``called`` says whether a call was made, ``finish_reason`` maps the
    engine's."""

    def __init__(
        self,
        mode: ToolMode,
        parser: str = DEFAULT_PARSER,
        names: tuple[str, ...] = (),
        parallel: bool = True,
        named: str | None = None,
        call_id: Callable[[], str] = new_call_id,
    ) -> None:
        if mode is ToolMode.NAMED and named is None:
            raise ValueError("a named tool_choice needs its function's name")
        if mode is ToolMode.AUTO and parser not in PARSERS:
            raise ValueError(f"unknown tool-call parser {parser!r}")
        self.mode = mode
        self._parser = parser
        self._names = frozenset(names)  # empty: any name is a call
        self._parallel = parallel
        self._named = named or ""
        self._call_id = call_id
        self._calls = 0
        self._sending = False  # the last call's pieces are sent (not a dropped extra call)
        self._out: list[Part] = []
        self._held_space = ""  # trailing whitespace of content, sent once more content follows
        self._after_call = False  # content right after a call loses its leading whitespace
        self._pending = ""  # text not decided on yet
        self._inside = False  # hermes: within a <tool_call> block
        self._searched = 0  # hermes: the block's text already searched for its end
        self._passthrough = False  # llama3_json / required: the rest is content
        self._object: ObjectEnd | None = None  # llama3_json: the object being read
        self._scanner: CallScanner | None = None  # required: the calls being read

    @property
    def called(self) -> bool:
        """Whether the answer made at least one call."""
        return self._calls > 0

    def finish_reason(self, engine_reason: str) -> str:
        """``tool_calls`` for an answer that made a call and stopped by itself; else the engine's
        (``length``, ``content_filter``: the calls so far are sent as they are)."""
        return "tool_calls" if self.called and engine_reason == "stop" else engine_reason

    def feed(self, text: str) -> list[Part]:
        if text:
            if self.mode is ToolMode.NONE:
                self._out.append(text)
            elif self.mode is ToolMode.NAMED:
                if not self._calls:
                    self._start_call(self._named)
                self._args(text)
            elif self.mode is ToolMode.REQUIRED:
                self._feed_required(text)
            elif self._parser == HERMES:
                self._pending += text
                self._scan_hermes(final=False)
            else:
                self._pending += text
                self._scan_llama(final=False)
        return self._take()

    def finish(self) -> list[Part]:
        if self.mode is ToolMode.NAMED and not self._calls:
            self._start_call(self._named)
        elif self.mode is ToolMode.REQUIRED and not self._calls:
            self._content(self._pending)  # no call was named: the text as it is
        elif self.mode is ToolMode.AUTO and self._parser == HERMES:
            self._scan_hermes(final=True)
        elif self.mode is ToolMode.AUTO:
            self._scan_llama(final=True)
        self._pending = ""
        if self._held_space and not self.called:
            self._out.append(self._held_space)
        self._held_space = ""
        return self._take()

    # ----- output -----
    def _take(self) -> list[Part]:
        """What was produced since the last call, adjacent pieces of the same kind joined."""
        out, self._out = self._out, []
        merged: list[Part] = []
        for part in out:
            last = merged[-1] if merged else None
            if isinstance(part, str):
                if isinstance(last, str):
                    merged[-1] = last + part
                elif part:
                    merged.append(part)
            elif isinstance(last, ToolCallDelta) and last.id is None and part.id is None:
                merged[-1] = ToolCallDelta(last.index, last.arguments + part.arguments)
            else:
                merged.append(part)
        return merged

    def _content(self, text: str) -> None:
        """Content, with whitespace next to a call dropped (trailing whitespace is held until more
        content follows)."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return
            self._after_call = False
        body = text.rstrip()
        if body:
            self._out.append(self._held_space + body)
            self._held_space = text[len(body) :]
        else:
            self._held_space += text

    def _start_call(self, name: str) -> None:
        """A new call named ``name``; not sent (nor its arguments) when it is an extra call and calls are
        not parallel."""
        self._sending = not self._calls or self._parallel
        if self._sending:
            self._held_space = ""
            self._out.append(ToolCallDelta(self._calls, "", self._call_id(), name))
            self._calls += 1
        self._after_call = True

    def _args(self, text: str) -> None:
        if text and self._sending:
            self._out.append(ToolCallDelta(self._calls - 1, text))

    def _as_call(self, value: Any, keys: tuple[str, ...]) -> tuple[str, str] | None:
        """(name, arguments JSON) of a parsed call object, or None when it is not a call of a declared
        function with an object of arguments (absent: none)."""
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return None
        if self._names and value["name"] not in self._names:
            return None
        present = [k for k in keys if k in value]
        arguments = value[present[0]] if present else {}
        if not isinstance(arguments, dict):
            return None
        return value["name"], json.dumps(arguments, ensure_ascii=False)

    def _whole_call(self, call: tuple[str, str]) -> None:
        self._start_call(call[0])
        self._args(call[1])

    # ----- hermes -----
    def _scan_hermes(self, final: bool) -> None:
        while True:
            if self._inside:
                end = self._pending.find(_CLOSE, max(0, self._searched - len(_CLOSE) + 1))
                if end < 0 and not final:
                    self._searched = len(self._pending)
                    return
                block = self._pending if end < 0 else self._pending[:end]
                self._pending = "" if end < 0 else self._pending[end + len(_CLOSE) :]
                self._inside = False
                call = self._as_call(_loads(block), ("arguments",))
                if call is not None:
                    self._whole_call(call)
                else:  # not a call: the block as the model wrote it
                    self._content(_OPEN + block + ("" if end < 0 else _CLOSE))
                if end < 0:
                    return
                continue
            start = self._pending.find(_OPEN)
            if start >= 0:
                self._content(self._pending[:start])
                self._pending = self._pending[start + len(_OPEN) :]
                self._inside, self._searched = True, 0
                continue
            keep = 0 if final else _partial_suffix(self._pending, _OPEN)
            self._content(self._pending[: len(self._pending) - keep])
            self._pending = self._pending[len(self._pending) - keep :]
            return

    # ----- llama3_json -----
    def _scan_llama(self, final: bool) -> None:
        while not self._passthrough:
            if self._object is None:
                start = _skip_space(self._pending, 0)
                if self.called and self._pending.startswith(";", start):
                    start = _skip_space(self._pending, start + 1)
                if start == len(self._pending):
                    if final:
                        self._content(self._pending)
                    return
                if self._pending[start] != "{":
                    self._to_passthrough(start if self.called else 0)
                    return
                self._object = ObjectEnd(start)
            end = self._object.scan(self._pending)
            if end is None:  # not closed yet
                if final:
                    self._to_passthrough(self._object.start if self.called else 0)
                return
            call = self._as_call(_loads(self._pending[self._object.start : end]), ("parameters", "arguments"))
            if call is None:
                self._to_passthrough(self._object.start if self.called else 0)
                return
            self._pending, self._object = self._pending[end:], None
            self._whole_call(call)
        if self._pending:
            self._content(self._pending)
            self._pending = ""

    def _to_passthrough(self, start: int) -> None:
        self._passthrough = True
        pending, self._pending = self._pending[start:], ""
        self._content(pending)

    # ----- required: the output is the call(s) as JSON -----
    def _feed_required(self, text: str) -> None:
        if self._passthrough:
            self._content(text)
            return
        self._pending += text  # kept until a call is named (content if none ever is)
        if self._scanner is None:
            start = _skip_space(self._pending, 0)
            if start == len(self._pending):
                return
            if self._pending[start] not in "[{":  # not the calls the guide asks for: content
                self._to_passthrough(0)
                return
            self._scanner = CallScanner(1 if self._pending[start] == "{" else 2)
            text = self._pending
        for event in self._scanner.feed(text):
            if isinstance(event, Named):
                self._start_call(event.name)
                self._args(event.arguments)
            else:
                self._args(event.text)
        if self._calls:
            self._pending = ""


def _skip_space(text: str, start: int) -> int:
    while start < len(text) and text[start].isspace():
        start += 1
    return start


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag`` (held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
