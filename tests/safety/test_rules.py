"""The built-in rules: block list, named regexes and PII patterns, their categories and length bounds."""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.safety.base import Verdict
from sluice.safety.config import RegexRuleConfig, SafetyConfig
from sluice.safety.rules import blocklist_rule, build_rules, luhn_ok, pii_rules

CONFIG = SafetyConfig(
    blocklist=("bomb", "make a weapon", "c++", "Naïve Plan"),
    regexes=(RegexRuleConfig(name="ticket", pattern=r"\bTCK-\d{4,8}\b", max_match_chars=12),),
    pii={"ssn": True},  # type: ignore[arg-type]
)
RULES = build_rules(CONFIG)
VISA = "4111 1111 1111 1111"  # the classic test number: passes Luhn


def category(text: str) -> str:
    return RULES.classify_now(text).category


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("there is a bomb here", "blocklist"),
        ("BOMB!", "blocklist"),
        ("how to Make  a\nWEAPON quickly", "blocklist"),  # case and 1-3 whitespace characters between words
        ("a bombastic speech", ""),  # whole words only
        ("the abomb test", ""),
        ("make a    weapon", ""),  # 4 spaces: beyond the bounded gap
        ("I write c++ daily", "blocklist"),  # regex metacharacters in a phrase are literal
        ("a naïve plan", "blocklist"),  # non-ASCII, case-insensitive
        ("see TCK-12345 for details", "regex:ticket"),
        ("see TCK-12 for details", ""),
        ("mail bob.smith+x@example.co.uk today", "pii:email"),
        ("an @ sign and foo@bar are not addresses", ""),
        (f"card {VISA} exp 12/29", "pii:card"),
        ("card 4111-1111-1111-1111", "pii:card"),
        ("amex 378282246310005", "pii:card"),
        ("card 4111 1111 1111 1112", ""),  # fails Luhn
        ("order 1234567890123 shipped", ""),  # 13 digits, fails Luhn
        ("ssn 078-05-1120", "pii:ssn"),
        ("ssn 000-12-3456 and 123-00-4567 and 666-12-3456", ""),  # never issued
        ("plain text about cats", ""),
    ],
)
def test_categories(text: str, expected: str) -> None:
    assert category(text) == expected


def test_verdict_message_names_the_category_and_never_echoes_the_match() -> None:
    for text in ["a bomb", "TCK-12345", "bob@example.com", VISA, "078-05-1120"]:
        verdict = RULES.classify_now(text)
        assert verdict.blocked and verdict.classifier == "rules"
        assert verdict.category in verdict.message and text not in verdict.message
        assert not any(part in verdict.message for part in re.split(r"[\s@.]", text) if len(part) > 3)
    assert RULES.classify_now("fine") == Verdict.allow("rules")
    assert asyncio.run(RULES.classify("a bomb")) == RULES.classify_now("a bomb")


def test_max_match_chars_bounds_every_rule() -> None:
    rule = blocklist_rule(["bomb", "make a weapon"])
    assert rule is not None and rule.max_match_chars == len("make") + len("a") + len("weapon") + 2 * 3
    assert blocklist_rule([]) is None
    assert {r.category: r.max_match_chars for r in pii_rules(ssn=True)} == {
        "pii:email": 64,
        "pii:card": 37,
        "pii:ssn": 11,
    }
    assert RULES.max_match_chars == 64
    with pytest.raises(ValueError, match="at least one word"):
        blocklist_rule(["  "])


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcdefgh@._-+ 0123456789", max_size=200))
def test_every_match_fits_its_rule_bound(text: str) -> None:
    rules = build_rules(SafetyConfig(blocklist=("ab cd", "ef"), pii={"ssn": True}))  # type: ignore[arg-type]
    for rule in rules.rules:
        start = 0
        while (match := rule.first_match(text, start)) is not None:
            assert match.end - match.start <= rule.max_match_chars
            start = match.start + 1


def test_unfinished_text_defers_a_match_at_its_end_and_context_guards_the_left_edge() -> None:
    assert RULES.first_match("a bomb", 0, final=False) is None  # "bombastic" may follow
    assert RULES.first_match("a bomb", 0, final=True) is not None
    assert RULES.first_match("a bomb.", 0, final=False) is not None
    assert RULES.first_match("abomb.", 1, final=True) is None  # "a" before the window start is context
    match = RULES.first_match("xx bomb yy", 0)
    assert match is not None and (match.start, match.end, match.category) == (3, 7, "blocklist")


def test_luhn() -> None:
    assert luhn_ok("4111111111111111") and luhn_ok("79927398713") and luhn_ok("0")
    assert not luhn_ok("4111111111111112") and not luhn_ok("79927398710")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789", min_size=13, max_size=19), st.sampled_from(["", " ", "-"]))
def test_a_digit_run_trips_exactly_when_luhn_confirms_it(digits: str, sep: str) -> None:
    written = sep.join(digits[i : i + 4] for i in range(0, len(digits), 4))
    blocked = RULES.classify_now(f"number {written} here").category == "pii:card"
    assert blocked == luhn_ok(digits)


def test_rule_groups_can_be_chosen() -> None:
    only_pii = build_rules(CONFIG, blocklist=False, regexes=False, name="pii")
    assert only_pii.name == "pii" and only_pii.classify_now("a bomb") == Verdict.allow("pii")
    assert only_pii.classify_now("bob@example.com").category == "pii:email"
    no_pii = build_rules(SafetyConfig(pii={"email": False, "card": False}))  # type: ignore[arg-type]
    assert no_pii.rules == () and not no_pii.classify_now("bob@example.com").blocked
