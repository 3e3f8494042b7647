"""Incremental JSON reading for tool calls: where an object ends, and the calls in a text of call objects
(their names and argument text as they arrive), one character at a time so no text is read twice."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _string(raw: str) -> str:
    """A JSON string's text from its raw characters (between the quotes)."""
    value = _loads(f'"{raw}"')
    return value if isinstance(value, str) else raw


class JsonNesting:
    """Follows JSON strings and nesting, one character at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def step(self, ch: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
        elif ch == '"':
            self.in_string = True
        elif ch in "[{":
            self.depth += 1
        elif ch in "]}":
            self.depth -= 1


class ObjectEnd(JsonNesting):
    """Where the JSON object starting at ``start`` of a growing text ends, read incrementally."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start
        self.pos = start

    def scan(self, text: str) -> int | None:
        """The index after the object's ``}``, or None while it is not closed. Only brackets and strings
        are followed: the caller parses what it cuts out."""
        while self.pos < len(text):
            self.step(text[self.pos])
            self.pos += 1
            if self.depth == 0 and not self.in_string:
                return self.pos
        return None


@dataclass(frozen=True, slots=True)
class Named:
    name: str
    arguments: str  # the call's argument text seen before its name


@dataclass(frozen=True, slots=True)
class ArgumentText:
    text: str  # more of the named call's argument text


class CallScanner(JsonNesting):
    """Streams calls out of JSON text: call objects at ``call_depth`` (1: the text is one call, 2: an
    array of calls), each ``{"name": "...", "arguments": ...}`` (other keys skipped). Reports ``Named``
    once a call's name is read (with the argument text read before it, for arguments that come first),
    then its argument text as it arrives."""

    def __init__(self, call_depth: int) -> None:
        super().__init__()
        self.call_depth = call_depth
        self.key: list[str] | None = None  # a key of the call object being read
        self.last_key = ""
        self.expect_key = False
        self.name: list[str] | None = None  # the call's name being read
        self.named = False  # the current call's name was read
        self.in_args = False  # reading the arguments value
        self.args_started = False  # its first character was read
        self.before_name: list[str] = []

    def feed(self, text: str) -> list[Named | ArgumentText]:
        events: list[Named | ArgumentText] = []
        args: list[str] = []
        for ch in text:
            if self.in_args:
                if not (self.depth == self.call_depth and not self.in_string and ch in ",}"):
                    if self.args_started or not ch.isspace():  # the value, without the space before it
                        self.args_started = True
                        args.append(ch)
                    self.step(ch)
                    continue
                self.in_args = False  # the value ended: the call object goes on
                self._flush(args, events)
            self._key_or_name(ch, events)
        self._flush(args, events)
        return events

    def _flush(self, args: list[str], events: list[Named | ArgumentText]) -> None:
        if not args:
            return
        if self.named:
            events.append(ArgumentText("".join(args)))
        else:
            self.before_name.extend(args)
        args.clear()

    def _key_or_name(self, ch: str, events: list[Named | ArgumentText]) -> None:
        """One character outside the arguments: keys and the name of a call object, nesting elsewhere."""
        in_call = self.depth == self.call_depth
        if in_call and self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                if self.key is not None:
                    self.last_key, self.key = _string("".join(self.key)), None
                elif self.name is not None:
                    name, self.name, self.named = _string("".join(self.name)), None, True
                    events.append(Named(name, "".join(self.before_name)))
                    self.before_name.clear()
                return
            (self.key if self.key is not None else self.name if self.name is not None else []).append(ch)
            return
        if in_call and not ch.isspace():
            if ch == '"' and self.expect_key:
                self.in_string, self.key, self.expect_key = True, [], False
                return
            if ch == ":":
                if self.last_key == "arguments":
                    self.in_args, self.args_started = True, False
                elif self.last_key == "name":
                    self.name = []
                return
            if ch == ",":
                self.expect_key, self.name = True, None
                return
        was = self.depth
        self.step(ch)
        if ch == "{" and was == self.call_depth - 1 and self.depth == self.call_depth:  # a new call
            self.expect_key, self.named, self.last_key, self.name = True, False, "", None
            self.before_name.clear()
