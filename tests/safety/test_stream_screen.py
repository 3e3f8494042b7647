"""The streaming screen: released text never reaches into a match, whatever the chunking; the holdback
and window bounds; and the same decision as screening the whole text at once."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.safety.base import Classifier, Verdict
from sluice.safety.config import SafetyConfig
from sluice.safety.fold import fold
from sluice.safety.rules import RulesClassifier, build_rules
from sluice.safety.stream import StreamScreen

PHRASES = ("bomb", "make a weapon", "naïve plän", "日本 刀")
RULES = build_rules(SafetyConfig(blocklist=PHRASES))  # plus the default PII rules (e-mail, card)
# The block list alone: its bound (17, "make   a   weapon") is reached, so a holdback or window one
# character short would show.
TIGHT = build_rules(SafetyConfig(blocklist=PHRASES, pii={"email": False, "card": False}))  # type: ignore[arg-type]
# Letters the phrases share, multi-byte characters (2, 3 and 4 UTF-8 bytes), separators, digits, "@".
ALPHABET = "abemko nwpïäl日本刀😀é\n.@-0123456789"


def stream(screen: StreamScreen, text: str, cuts: list[int]) -> tuple[str, Verdict | None]:
    """Feed ``text`` cut at ``cuts``; the concatenation of everything released, and the verdict."""
    bounds = [0, *sorted(set(cuts)), len(text)]
    released = []
    for a, b in itertools.pairwise(bounds):
        out, verdict = screen.feed(text[a:b])
        released.append(out)
        if verdict is not None:
            return "".join(released), verdict
    out, verdict = screen.finish()
    return "".join(released) + out, verdict


@st.composite
def texts_with_a_phrase(draw: st.DrawFn) -> tuple[str, list[int]]:
    before = draw(st.text(alphabet=ALPHABET, max_size=150))
    after = draw(st.text(alphabet=ALPHABET, max_size=80))
    phrase = draw(st.sampled_from([*PHRASES, "BOMB", "Make  a\tWeapon", "make   a \n Weapon"]))
    text = f"{before} {phrase} {after}"
    if draw(st.booleans()):  # a PII match too, for the full rule set
        text = f"{before} bob@example.com {after} {phrase}"
    cuts = draw(st.lists(st.integers(0, len(text)), max_size=40))
    return text, cuts


@settings(max_examples=500, deadline=None)
@given(texts_with_a_phrase(), st.sampled_from([TIGHT, RULES]), st.integers(0, 30), st.integers(0, 30))
def test_released_text_always_ends_before_the_first_match(
    case: tuple[str, list[int]], rules: RulesClassifier, extra_holdback: int, extra_window: int
) -> None:
    text, cuts = case
    holdback = rules.max_match_chars + extra_holdback // 3  # mostly the tightest holdbacks
    screen = StreamScreen([rules], holdback, window_chars=holdback + extra_window // 3)
    released, verdict = stream(screen, text, cuts)
    first = rules.first_match(fold(text))  # folding maps this alphabet one to one: same positions
    assert first is not None  # the phrase is there, surrounded by spaces
    assert verdict is not None and verdict.blocked
    # A prefix of the text that stops before the match: no character of the match was ever sent.
    assert text.startswith(released)
    assert len(released) <= first.start
    assert screen.num_released_chars == len(released)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=ALPHABET, max_size=250), st.lists(st.integers(0, 250), max_size=40))
def test_the_stream_decides_as_the_whole_text_would(text: str, cuts: list[int]) -> None:
    screen = StreamScreen([RULES], RULES.max_match_chars)
    released, verdict = stream(screen, text, [c for c in cuts if c <= len(text)])
    whole = RULES.classify_now(text)
    assert (verdict is not None) == whole.blocked
    if verdict is None:
        assert released == text  # all of it, in order, once
    else:
        assert verdict == whole or verdict.blocked  # the first trip may be another rule's
        first = RULES.first_match(fold(text))
        assert first is not None and text.startswith(released) and len(released) <= first.start


def test_only_text_a_match_could_still_start_in_is_held_back() -> None:
    screen = StreamScreen([RULES], holdback_chars=64)
    assert screen.feed("Hello there, my friend") == ("Hello there, my ", None)  # "friend" may be an e-mail
    assert screen.feed("ly note") == ("friendly ", None)
    assert screen.feed(" 4111 ") == ("note ", None)  # digits may become a card number
    assert screen.feed("1111 1111 1112 done") == ("4111 1111 1111 1112 ", None)  # fails Luhn: not a card
    assert screen.finish() == ("done", None)
    # A word longer than an e-mail's local part (32) cannot start one: only its last 32 are held.
    long = StreamScreen([RULES], holdback_chars=64)
    released, _ = long.feed("x" * 100)
    assert released == "x" * 68 and long.num_held_chars == 32
    rest, verdict = long.finish()
    assert verdict is None and released + rest == "x" * 100
    assert long.finish() == ("", None)


def test_a_word_completed_by_the_next_chunk_is_not_a_match() -> None:
    screen = StreamScreen([RULES], holdback_chars=64)
    pieces = ["The speech was bomb", "astic and long", "."]
    released, verdict = stream(screen, "".join(pieces), [19, 33])
    assert verdict is None and released == "The speech was bombastic and long."


def test_a_trip_sticks_and_pii_split_across_tokens_is_caught() -> None:
    screen = StreamScreen([RULES], holdback_chars=64)
    out = []
    for piece in ["Write to ", "bob", ".smith", "@", "exam", "ple", ".", "com", " today"]:
        released, verdict = screen.feed(piece)
        out.append(released)
        if verdict is not None:
            break
    # The text before the address goes with the verdict (the stream ends there); none of the address.
    assert verdict is not None and verdict.category == "pii:email" and "".join(out) == "Write to "
    assert screen.feed("more") == ("", verdict) and screen.finish() == ("", verdict)
    card = StreamScreen([RULES], holdback_chars=64)
    released, verdict = stream(card, "x" * 100 + " 4111 1111 1111 1111 ok", list(range(0, 130, 3)))
    assert verdict is not None and verdict.category == "pii:card" and released == "x" * 100 + " "


def test_memory_stays_bounded_on_a_long_stream() -> None:
    screen = StreamScreen([RULES], holdback_chars=64)
    total = []
    for _ in range(20_000):
        total.append(screen.feed("lorem ipsum ")[0])
    assert len(screen._buf) < 1000  # trimmed as it goes, not the whole 240,000 characters
    total.append(screen.finish()[0])
    assert "".join(total) == "lorem ipsum " * 20_000


class _Remote(Classifier):
    name = "remote"

    async def classify(self, text: str) -> Verdict:
        return Verdict.allow(self.name)


def test_construction_refuses_a_holdback_shorter_than_a_match_or_a_remote_classifier() -> None:
    with pytest.raises(ValueError, match=r"holdback_chars \(63\) must be >= 1 and >= the longest match"):
        StreamScreen([RULES], holdback_chars=63)
    with pytest.raises(ValueError, match="window_chars"):
        StreamScreen([RULES], holdback_chars=64, window_chars=10)
    with pytest.raises(ValueError, match="cannot screen a stream"):
        StreamScreen([RULES, _Remote()], holdback_chars=64)
    with pytest.raises(ValueError, match=">= 1"):
        StreamScreen([RulesClassifier([])], holdback_chars=0)
