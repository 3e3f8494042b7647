"""A bound on how deeply a JSON request body may nest, checked on the raw bytes before it is decoded.

msgspec (under Litestar's ``request.json()`` and its conversion to the request Structs) recurses once
per level: ``tools`` or ``content`` nested 5,000 arrays deep raised ``RecursionError``, a 500. The check
here never recurses and costs a few linear passes in C (about 2 ms for a 1 MiB prompt, 0.1 ms for
10,000 brackets):

1. a body with at most ``max_depth`` brackets cannot nest deeper; nothing more to do (most requests);
2. otherwise the text outside JSON strings is reduced to its brackets, and the running depth (+1 for
   ``[`` or ``{``, -1 for ``]`` or ``}``) must stay within ``0..max_depth`` and end at 0.

Brackets that do not pair up (``[[[`` with no end) leave something behind too: refused the same way, as
msgspec would refuse the body anyway (and might recurse before seeing that it is malformed).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from litestar import Request

from gateway.errors import invalid_request

# Far deeper than any OpenAI request needs (a tool's JSON schema rarely passes 10).
MAX_JSON_DEPTH = 64

_DELETE_ALL_BUT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_OPEN_ARRAY, _OPEN_OBJECT = ord("["), ord("{")


def _outside_strings(body: bytes) -> bytes:
    """The body's bytes outside JSON strings. Escapes pair up from the left (``\\\\`` first), so a quote
    still preceded by a backslash is escaped; the quotes left delimit the strings."""
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[::2])


def json_nesting_exceeds(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """True if ``body`` nests arrays/objects more than ``max_depth`` deep, or its brackets (outside
    strings) do not pair up. Never recurses; linear in the body."""
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return False
    brackets = np.frombuffer(_outside_strings(body).translate(None, _DELETE_ALL_BUT_BRACKETS), np.uint8)
    if brackets.size == 0:
        return False
    # The nesting depth after each bracket: +1 for an opening one, -1 for a closing one.
    depth = np.cumsum(np.where((brackets == _OPEN_ARRAY) | (brackets == _OPEN_OBJECT), 1, -1))
    return bool(depth.max() > max_depth or depth.min() < 0 or depth[-1] != 0)


class BoundedJSONRequest(Request[Any, Any, Any]):
    """Litestar's request, refusing (400) a JSON body nested deeper than ``MAX_JSON_DEPTH`` before
    decoding it."""

    _depth_checked = False

    async def json(self) -> Any:
        if not self._depth_checked:
            if json_nesting_exceeds(await self.body()):
                raise invalid_request(
                    f"The request body nests arrays or objects more than {MAX_JSON_DEPTH} levels deep.",
                    code="json_too_deep",
                )
            self._depth_checked = True
        return await super().json()
