"""The JSON nesting bound checked on raw bytes (gateway.openai.body) agrees with the nesting of the
decoded value, for any JSON (strings full of brackets, quotes and escapes included), at and around the
bound."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.openai.body import json_nesting_exceeds

_SCALARS = st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ax', max_size=8)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=4), inner, max_size=3)
    ),
    max_leaves=40,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_JSON, st.integers(0, 12))
def test_agrees_with_the_decoded_depth(value: Any, max_depth: int) -> None:
    body = json.dumps(value).encode()
    assert json_nesting_exceeds(body, max_depth) == (_depth(value) > max_depth)


def test_exactly_at_the_bound_passes_and_one_more_is_refused() -> None:
    for depth in (64, 65):
        body = ("[" * depth + "]" * depth).encode()
        assert json_nesting_exceeds(body, 64) == (depth > 64)


def test_unbalanced_brackets_are_refused() -> None:
    assert json_nesting_exceeds(b"[" * 100, 64)
    assert json_nesting_exceeds(b"]" * 70 + b"[" * 70, 64)
