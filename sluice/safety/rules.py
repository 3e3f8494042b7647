"""The built-in rules: a block list, named regular expressions and PII patterns, as one synchronous
classifier cheap enough to screen every streamed chunk.

Every rule matches the text folded (``sluice.safety.fold``: NFKD, marks and invisible characters removed,
look-alike letters mapped to Latin), so ``ｂ\u200bоmb`` (fullwidth, zero-width space, Cyrillic o) is
``bomb``. Block-list phrases are folded the same way when the rules are built; configured regexes are
applied to folded text as written (``é`` in a pattern never matches: the text has ``e``).
``classify_now`` / ``classify`` fold the text they are given; the window methods the streaming screen
calls (``classify_window``, ``first_match``, ``earliest_*``) take text already folded, and their
positions are positions in it.

Every rule knows the longest span it can match (``max_match_chars``, in folded characters): the
streaming screen holds back at least that much text, so a match completed by a later chunk never had its
start sent. For a block-list phrase it is computed (words joined by 1-3 whitespace characters); for a
configured regex it is the configured bound; the PII patterns below are written with bounded repetitions
so theirs is exact.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import regex

from sluice.safety.base import Classifier, Verdict
from sluice.safety.config import SafetyConfig
from sluice.safety.fold import fold

# Between the words of a block-list phrase; bounded so the phrase's longest match is known.
_MAX_GAP_CHARS = 3
# Keeps the trie's nesting (and `re`'s) shallow; a longer entry is a sentence, not a phrase.
MAX_PHRASE_CHARS = 256

# E-mail: a bounded core (up to 32 characters before the @, one domain label, 2-6 letters after the dot)
# so a match is at most 64 characters. A longer address is still caught, by its last 32 characters
# before the @ and its first labels; with the default holdback its earlier characters may be sent.
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9-]{1,24}\.[A-Za-z]{2,6}")
# Payment card: 13-19 digits, optionally one space or dash between any two; confirmed by Luhn.
_CARD = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")
# US SSN as written NNN-NN-NNNN, without the never-issued areas 000, 666, 9xx, group 00, serial 0000.
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])")


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a string of ASCII digits (a random digit run passes one time in ten)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_ok(span: str) -> bool:
    digits = span.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and luhn_ok(digits)


@dataclass(frozen=True)
class RuleMatch:
    category: str
    start: int
    end: int


_FLAGS = ((re.IGNORECASE, regex.IGNORECASE), (re.MULTILINE, regex.MULTILINE), (re.DOTALL, regex.DOTALL),
          (re.VERBOSE, regex.VERBOSE))  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """One pattern. ``confirm`` turns a candidate into a match (the Luhn check); ``needs`` is a character
    every match contains, checked first so most windows skip the regex."""

    category: str
    pattern: re.Pattern[str]
    max_match_chars: int
    confirm: Callable[[str], bool] | None = None
    needs: str | None = None

    @cached_property
    def _partial(self) -> regex.Pattern[str]:
        """The same pattern in the ``regex`` module, which can report a match cut short by the end of
        the text (``partial=True``): the decisions stay with ``re``; this only says where to wait."""
        flags = 0
        for re_flag, regex_flag in _FLAGS:
            if self.pattern.flags & re_flag:
                flags |= regex_flag
        return regex.compile(self.pattern.pattern, flags)

    def earliest_possible_start(self, text: str, start: int = 0) -> int:
        """The first position at or after ``start`` where a match could begin once more text arrives
        (a match cut short by the end, one running to the end, or a confirmed one), else ``len(text)``:
        everything before it can be sent without waiting."""
        end_of_text = len(text)
        for m in self._partial.finditer(text, start, partial=True):
            if m.partial or m.end() == end_of_text:
                return int(m.start())
            if m.end() > m.start() and (self.confirm is None or self.confirm(m.group())):
                return int(m.start())
        return end_of_text

    def first_match(self, text: str, start: int = 0, final: bool = True) -> RuleMatch | None:
        """The first confirmed match starting at or after ``start`` (``text[:start]`` is context for
        lookbehinds). Unless ``final``, a match reaching the end of ``text`` is not reported: the next
        characters may still undo it, and the caller screens it again once they arrive."""
        if self.needs is not None and text.find(self.needs, start) < 0:
            return None
        end_of_text = len(text)
        for m in self.pattern.finditer(text, start):
            if m.end() == m.start():
                continue
            if not final and m.end() == end_of_text:
                return None  # finditer's matches are ordered: nothing later ends earlier
            if self.confirm is None or self.confirm(m.group()):
                return RuleMatch(self.category, m.start(), m.end())
        return None


def _phrase_atoms(phrase: str) -> list[str]:
    """The phrase as regex atoms: one escaped character each, and a bounded gap between words."""
    atoms: list[str] = []
    for i, word in enumerate(phrase.split()):
        if i:
            atoms.append(rf"\s{{1,{_MAX_GAP_CHARS}}}")
        atoms.extend(re.escape(c) for c in word)
    return atoms


def _trie_regex(node: dict[str, Any]) -> str:
    """One alternation per branching point of the phrases' trie (``""`` marks a phrase's end). NOTE: `re`
    tries alternatives one by one, so 200 phrases as one flat alternation cost ~8x more per window."""
    alternatives = [atom + _trie_regex(child) for atom, child in node.items() if atom]
    if not alternatives:
        return ""
    body = alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"
    return f"(?:{body})?" if "" in node else body


def blocklist_rule(phrases: Iterable[str]) -> Rule | None:
    """Whole words or phrases, case-insensitive, the words separated by 1-3 whitespace characters; not
    matched inside a longer word (``class`` does not match ``classic``). Phrases are folded, as the text
    will be. None for an empty list."""
    trie: dict[str, Any] = {}
    max_chars = 0
    for given in phrases:
        phrase = fold(given)
        words = phrase.split()
        if not words:
            raise ValueError(f"a block-list entry needs at least one word, got {given!r}")
        if len(phrase) > MAX_PHRASE_CHARS:
            raise ValueError(f"a block-list entry must be at most {MAX_PHRASE_CHARS} characters")
        node = trie
        for atom in _phrase_atoms(phrase):
            node = node.setdefault(atom, {})
        node[""] = {}
        # NOTE: IGNORECASE in `re` folds one character to one character, so this bound holds.
        max_chars = max(max_chars, sum(map(len, words)) + _MAX_GAP_CHARS * (len(words) - 1))
    if not trie:
        return None
    pattern = re.compile(r"(?<!\w)" + _trie_regex(trie) + r"(?!\w)", re.IGNORECASE)
    return Rule("blocklist", pattern, max_chars)


def pii_rules(email: bool = True, card: bool = True, ssn: bool = False) -> list[Rule]:
    rules = []
    if email:
        rules.append(Rule("pii:email", _EMAIL, 64, needs="@"))
    if card:
        rules.append(Rule("pii:card", _CARD, 19 + 18, confirm=_card_ok))
    if ssn:
        rules.append(Rule("pii:ssn", _SSN, 11, needs="-"))
    return rules


class RulesClassifier(Classifier):
    """Rules checked in order; the first match decides. Pure CPU, no state between calls. The window
    methods take folded text (see the module docstring)."""

    supports_streaming = True
    max_match_chars: int  # always known for rules

    def __init__(self, rules: Sequence[Rule], name: str = "rules") -> None:
        self.name = name
        self.rules = tuple(rules)
        self.max_match_chars = max((r.max_match_chars for r in self.rules), default=0)

    def first_match(self, text: str, start: int = 0, final: bool = True) -> RuleMatch | None:
        for rule in self.rules:
            match = rule.first_match(text, start, final)
            if match is not None:
                return match
        return None

    def earliest_possible_start(self, text: str, start: int) -> int:
        return min((r.earliest_possible_start(text, start) for r in self.rules), default=len(text))

    def earliest_match_start(self, text: str, start: int) -> int | None:
        starts = [m.start for rule in self.rules if (m := rule.first_match(text, start, True)) is not None]
        return min(starts, default=None)

    def classify_window(self, text: str, start: int, final: bool) -> Verdict:
        match = self.first_match(text, start, final)
        return Verdict.allow(self.name) if match is None else Verdict.block(self.name, match.category)

    def classify_now(self, text: str) -> Verdict:
        return self.classify_window(fold(text), 0, True)

    async def classify(self, text: str) -> Verdict:
        return self.classify_now(text)


def build_rules(
    config: SafetyConfig,
    blocklist: bool = True,
    regexes: bool = True,
    pii: bool = True,
    name: str = "rules",
) -> RulesClassifier:
    """The configured rules, or the chosen groups of them."""
    rules: list[Rule] = []
    if blocklist and (rule := blocklist_rule(config.blocklist)) is not None:
        rules.append(rule)
    if regexes:
        for r in config.regexes:
            bound = r.max_match_chars or config.regex_max_match_chars
            rules.append(Rule(f"regex:{r.name}", re.compile(r.pattern), bound))
    if pii:
        rules.extend(pii_rules(config.pii.email, config.pii.card, config.pii.ssn))
    return RulesClassifier(rules, name=name)
