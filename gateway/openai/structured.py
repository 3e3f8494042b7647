"""Structured output at admission: ``response_format`` as the engine's ``Guide``, checked before any
engine work. A guide is compiled against the target model's tokenizer exactly as the engine will compile
it (``sluice.guides``, llguidance): a schema the library cannot compile, or a keyword it does not
support, is a 400 naming the library's reason, never a replica's error mid-stream.

Compiling takes a millisecond for a typical schema and is bounded by llguidance's fuel; a guide not seen
before is compiled in a worker thread (the library releases the GIL), and the guides that compiled are
remembered per tokenizer, so a repeated schema costs a dictionary lookup.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import anyio.to_thread
import llguidance

from gateway.errors import invalid_request
from gateway.openai.schemas import ResponseFormat
from gateway.openai.strict_schema import strict_schema_problem
from sluice.guides import COMPILE_LIMITS, GrammarError, grammar_text
from sluice.text import TextCodec
from sluice.wire import Guide, GuideKind

MAX_SCHEMA_BYTES = 64 * 1024  # a schema's JSON text; far above any real one, far below a costly compile
KNOWN_GOOD = 1024  # guides remembered per tokenizer


def guide_of(response_format: ResponseFormat | None) -> Guide | None:
    """The guide ``response_format`` asks for: None for text (or none given). Raises a 400 naming the
    field for a json_schema format without its schema, a schema too large, or a strict one that breaks
    OpenAI's strict rules (``strict_schema``)."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return Guide(GuideKind.JSON)
    spec = response_format.json_schema
    if spec is None:
        raise invalid_request(
            "response_format of type 'json_schema' needs its 'json_schema' (name and schema).",
            param="response_format.json_schema",
        )
    if spec.strict and (problem := strict_schema_problem(spec.schema or {})) is not None:
        raise invalid_request(
            f"Invalid schema for response_format '{spec.name}': {problem}", param="response_format"
        )
    text = json.dumps(spec.schema if spec.schema is not None else {}, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise invalid_request(
            f"response_format.json_schema.schema is {len(text.encode())} bytes; at most {MAX_SCHEMA_BYTES}.",
            param="response_format.json_schema.schema",
        )
    return Guide(GuideKind.JSON_SCHEMA, text)


class _Checker:
    """The guides known to compile for one tokenizer (bounded, least recently used dropped first)."""

    def __init__(self, codec: TextCodec) -> None:
        self.tokenizer = llguidance.LLTokenizer(codec.tokenizer_json, eos_token=list(codec.eos_token_ids))
        self.good: OrderedDict[Guide, None] = OrderedDict()
        self.lock = threading.Lock()

    def error(self, guide: Guide) -> str:
        """Why ``guide`` cannot be compiled, or "" (runs in a worker thread)."""
        try:
            grammar = grammar_text(guide)
        except GrammarError as exc:
            return str(exc)
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=COMPILE_LIMITS)
        return matcher.get_error() if matcher.is_error() else ""


_checkers: dict[int, tuple[TextCodec, _Checker]] = {}
_checkers_lock = threading.Lock()


def _checker(codec: TextCodec) -> _Checker:
    with _checkers_lock:
        held = _checkers.get(id(codec))
        if held is None or held[0] is not codec:
            held = (codec, _Checker(codec))
            _checkers[id(codec)] = held
        return held[1]


async def check_guide(guide: Guide | None, codec: TextCodec, param: str) -> None:
    """A 400 (``param``, code ``invalid_response_format``) if ``guide`` cannot be compiled for ``codec``'s
    tokenizer; nothing for None or a guide that compiled before."""
    if guide is None:
        return
    checker = (
        await anyio.to_thread.run_sync(_checker, codec) if id(codec) not in _checkers else _checker(codec)
    )
    with checker.lock:
        if guide in checker.good:
            checker.good.move_to_end(guide)
            return
    error = await anyio.to_thread.run_sync(checker.error, guide)
    if error:
        raise invalid_request(
            f"The {guide.kind.value} cannot be used for structured output: {_first_line(error)}",
            param=param,
            code="invalid_response_format",
        )
    with checker.lock:
        checker.good[guide] = None
        if len(checker.good) > KNOWN_GOOD:
            checker.good.popitem(last=False)


def _first_line(error: Any) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:500] if text else "unknown error"
