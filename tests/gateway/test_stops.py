"""Stop strings on streamed text, however the text is split into pieces."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gateway.openai.stops import StopMatcher

ALPHABET = st.sampled_from("ab😀\n")


@given(
    text=st.text(ALPHABET, max_size=40),
    stops=st.lists(st.text(ALPHABET, min_size=1, max_size=4), max_size=4),
    cuts=st.lists(st.integers(0, 40), max_size=6),
)
def test_output_is_the_text_cut_before_the_stop_complete_first(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    matcher = StopMatcher(stops)
    out, hit = "", False
    for a, b in itertools.pairwise(bounds):
        emitted, hit = matcher.feed(text[a:b])
        out += emitted
        if hit:
            break
    if not hit:
        out += matcher.flush()
    # The stop string complete first wins: earliest end, then the longer one.
    found = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    assert hit == bool(found)
    assert out == (text[: min(found)[1]] if found else text)
