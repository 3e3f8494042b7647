"""A bound on how deeply a JSON request body may nest, checked on the raw bytes before it is decoded.

msgspec (under Litestar's ``request.json()`` and its conversion to the request Structs) recurses once
per level: ``tools`` or ``content`` nested 5,000 arrays deep raised ``RecursionError``, a 500. The check
here never recurses and costs a few byte-string passes (about 2 ms for a 1 MiB prompt):

1. a body with at most ``max_depth`` brackets cannot nest deeper; nothing more to do (most requests);
2. otherwise the text outside JSON strings is reduced to its brackets (``{`` as ``[``, ``}`` as ``]``),
   and every innermost pair ``[]`` is removed once per pass: each pass takes exactly one level off the
   deepest nesting, so the body is within the bound if the brackets are gone after ``max_depth`` passes.

Brackets that do not pair up (``[[[`` with no end) leave something behind too: refused the same way, as
msgspec would refuse the body anyway (and might recurse before seeing that it is malformed).
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from gateway.errors import invalid_request

# Far deeper than any OpenAI request needs (a tool's JSON schema rarely passes 10).
MAX_JSON_DEPTH = 64

_DELETE_ALL_BUT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def _outside_strings(body: bytes) -> bytes:
    """The body's bytes outside JSON strings. Escapes pair up from the left (``\\\\`` first), so a quote
    still preceded by a backslash is escaped; the quotes left delimit the strings."""
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    return b"".join(unescaped.split(b'"')[::2])


def json_nesting_exceeds(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """True if ``body`` nests arrays/objects more than ``max_depth`` deep, or its brackets (outside
    strings) do not pair up. Never recurses; linear in the body per level of nesting."""
    if body.count(b"[") + body.count(b"{") <= max_depth:
        return False
    brackets = _outside_strings(body).translate(None, _DELETE_ALL_BUT_BRACKETS)
    brackets = brackets.replace(b"{", b"[").replace(b"}", b"]")
    for _ in range(max_depth):
        if not brackets:
            return False
        inner_removed = brackets.replace(b"[]", b"")
        if len(inner_removed) == len(brackets):  # no innermost pair: unbalanced
            return True
        brackets = inner_removed
    return bool(brackets)


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
