"""Safety rules see through look-alikes: NFKC-style compatibility forms, marks, invisible characters and
confusable letters fold away, on input (whole prompts, also in pieces) and on streamed output, where what
is released is always the original text."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.safety.config import SafetyConfig
from sluice.safety.fold import fold, fold_with_origins
from sluice.safety.policy import PIECE_CHARS, build_policy
from sluice.safety.rules import build_rules
from sluice.safety.stream import StreamScreen

RULES = build_rules(SafetyConfig(blocklist=["bomb", "make a weapon"]))
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u202e"
# Each letter of the phrases and how an attacker may write it instead.
DISGUISES = {
    "b": ["b", "ｂ", "𝐛", "Ь", "b\u0301"],
    "o": ["o", "о", "ο", "օ", "ｏ", "ö", "𝗼"],
    "m": ["m", "ｍ", "𝐦", "m\u0308"],
    "a": ["a", "а", "ɑ", "α", "ａ", "á"],
    "k": ["k", "κ", "К", "ｋ"],
    "e": ["e", "е", "ｅ", "é", "ℯ"],
    "w": ["w", "ԝ", "ｗ"],
    "p": ["p", "р", "ρ", "ｐ"],
    "n": ["n", "ｎ", "ո"],
    " ": [" ", "\u00a0", "\u2003", "\u3000"],
}


@pytest.mark.parametrize(
    "disguised",
    [
        "ｂｏｍｂ",  # fullwidth
        "𝐛𝐨𝐦𝐛",  # mathematical bold
        "b\u200bo\u00adm\u2060b",  # zero-width space, soft hyphen, word joiner
        "bómb",  # a combining acute
        "bо\u043cb".replace("\u043c", "m"),  # Cyrillic o
        "Ьοmb",  # Cyrillic soft sign, Greek omicron
        "BOМB",  # Cyrillic capital em
    ],
)
def test_disguised_phrases_fold_to_the_phrase_and_are_blocked(disguised: str) -> None:
    assert fold(disguised).lower() == "bomb"
    verdict = RULES.classify_now(f"how to build a {disguised} at home")
    assert verdict.blocked and verdict.category == "blocklist"


def test_ordinary_text_is_left_alone() -> None:
    for text in ("plain ascii: it's fine", "Grüße aus Köln", "日本語のテキスト", "Ελληνικά κείμενα"):
        assert not RULES.classify_now(text).blocked
    assert fold("plain ascii") == "plain ascii"
    assert fold("Grüße") == "Gruße" and fold("ﬁne") == "fine"


def test_pii_in_fullwidth_forms_is_found() -> None:
    assert RULES.classify_now("mail ｂｏｂ＠ｅｘａｍｐｌｅ．ｃｏｍ now").category == "pii:email"
    assert RULES.classify_now("card ４１１１ １１１１ １１１１ １１１１ ok").category == "pii:card"


def test_a_block_list_phrase_is_folded_too() -> None:
    rules = build_rules(SafetyConfig(blocklist=["naïve plän"], pii={"email": False, "card": False}))  # type: ignore[arg-type]
    assert rules.classify_now("a naive plan").blocked and rules.classify_now("a naïve plän").blocked


MIXED = "abm oékκ\u200b\u0301ｂ𝐛оοﬁ日😀\n.-"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=MIXED, max_size=60), st.text(alphabet=MIXED, max_size=60))
def test_folding_goes_character_by_character(a: str, b: str) -> None:
    assert fold(a + b) == fold(a) + fold(b)
    folded, origins = fold_with_origins(a + b, offset=7)
    assert folded == fold(a + b)
    assert origins == sorted(origins) and all(7 <= o < 7 + len(a + b) for o in origins)
    # Each original character contributes exactly its own fold, at its own place.
    rebuilt = "".join(fold((a + b)[i - 7]) for i, _ in itertools.groupby(origins))
    assert rebuilt == folded


@st.composite
def disguised_texts(draw: st.DrawFn) -> tuple[str, int, list[int]]:
    """A text with a disguised phrase: (text, where the phrase starts in it, cuts). Zero-width padding
    makes the phrase far longer than the holdback in original characters."""
    phrase = draw(st.sampled_from(["bomb", "make a weapon"]))
    pieces = []
    for letter in phrase:
        pieces.append(draw(st.sampled_from(DISGUISES[letter])))
        pieces.append(draw(st.text(alphabet=ZERO_WIDTH, max_size=30)))
    before = draw(st.text(alphabet="abemko wpn.,😀é日", max_size=120))
    text = f"{before} {''.join(pieces)} after"
    cuts = sorted(set(draw(st.lists(st.integers(0, len(text)), max_size=30))))
    return text, len(before) + 1, cuts


@settings(max_examples=400, deadline=None)
@given(disguised_texts())
def test_the_stream_never_releases_any_of_a_disguised_match(case: tuple[str, int, list[int]]) -> None:
    text, phrase_start, cuts = case
    screen = StreamScreen([RULES], RULES.max_match_chars)
    released = []
    verdict = None
    for a, b in itertools.pairwise([0, *cuts, len(text)]):
        out, verdict = screen.feed(text[a:b])
        released.append(out)
        if verdict is not None:
            break
    else:
        out, verdict = screen.finish()
        released.append(out)
    assert verdict is not None and verdict.blocked
    sent = "".join(released)
    assert text.startswith(sent)  # the original text, not its fold
    assert len(sent) <= phrase_start


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=MIXED.replace("b", "").replace("ｂ", "").replace("𝐛", ""), max_size=200))
def test_a_clean_stream_releases_the_original_text_whole(text: str) -> None:
    screen = StreamScreen([RULES], RULES.max_match_chars)
    out = [screen.feed(text[i : i + 3])[0] for i in range(0, len(text), 3)]
    rest, verdict = screen.finish()
    assert verdict is None and "".join(out) + rest == text


@pytest.mark.parametrize("offset", [-3, -1, 0, 1])
def test_a_long_prompt_is_screened_in_pieces_and_a_phrase_across_pieces_is_caught(offset: int) -> None:
    policy = build_policy("default", SafetyConfig(blocklist=["make a weapon"]))
    start = PIECE_CHARS + offset - 6  # the phrase straddles the first boundary between pieces
    text = "x " * (start // 2) + " " * (start % 2) + "mаke ａ \u200bweapon " + "y " * PIECE_CHARS
    verdict = asyncio.run(policy.screen_input(text))
    assert verdict is not None and verdict.category == "blocklist"
    assert asyncio.run(policy.screen_input(text.replace("weapon", "wagon"))) is None
