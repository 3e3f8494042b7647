"""Fold text to the form the safety rules match: the same letters however they were dressed up.

``fold(text)`` is, character by character:

1. Unicode compatibility decomposition (NFKD, which NFKC's matching power comes from): fullwidth
   ``ｂｏｍｂ``, mathematical ``𝐛𝐨𝐦𝐛``, ligatures ``ﬁ`` and the like become plain letters, accented letters
   become the letter plus combining marks;
2. combining marks (Mn, Me), format characters (Cf: zero-width space/joiners, soft hyphen, bidi controls,
   tags) and invisible fillers are removed, so ``b\u200bomb`` and ``bómb`` read ``bomb``;
3. the common look-alikes of Latin letters (Cyrillic ``о``, Greek ``ο``, Armenian ``օ``, Latin IPA ``ɑ``...)
   become those letters (``CONFUSABLES``: a small table of the letters attackers use, not all of Unicode's
   confusables.txt).

Each character folds on its own (decomposition never joins characters, and the marks it could reorder
are removed), so ``fold(a + b) == fold(a) + fold(b)``: a stream can be folded piece by piece, and every
folded character comes from exactly one original character (``fold_with_origins``). ASCII folds to itself.
Case is left alone (the rules that care match case-insensitively).
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

import regex

# Marks, format characters, and the letters Unicode classes as Lo but renders as nothing.
_INVISIBLE = regex.compile(r"[\p{Mn}\p{Me}\p{Cf}\u115F\u1160\u3164\uFFA0]+")

# Latin letter -> its look-alikes in Cyrillic, Greek, Armenian and Latin IPA.
_LOOKALIKES = {
    "a": "аɑα", "b": "Ь", "c": "сϲ", "d": "ԁ", "e": "еҽ", "g": "ɡ", "h": "һհ", "i": "іıɩι", "j": "јϳȷ",
    "k": "κ", "l": "ӏ", "n": "ո", "o": "оοօ", "p": "рρ", "q": "ԛ", "s": "ѕ", "u": "υս", "v": "νѵ",
    "w": "ԝ", "x": "хχ", "y": "уү",
    "A": "АΑ", "B": "ВΒ", "C": "СϹ", "E": "ЕΕ", "H": "НΗ", "I": "ІӀΙ", "J": "Ј", "K": "КΚ", "M": "МΜ",
    "N": "Ν", "O": "ОΟՕ", "P": "РΡ", "S": "ЅՏ", "T": "ТΤ", "X": "ХΧ", "Y": "ҮΥ", "Z": "Ζ",
}  # fmt: skip
CONFUSABLES: dict[int, str] = {ord(c): latin for latin, chars in _LOOKALIKES.items() for c in chars}


def fold(text: str) -> str:
    """``text`` as the rules match it (see the module docstring)."""
    if text.isascii():
        return text
    # NOTE: the look-alikes are mapped before decomposing too: some decompose to letters that are not
    # look-alikes themselves (lunate sigma ϲ to final sigma ς).
    decomposed = unicodedata.normalize("NFKD", text.translate(CONFUSABLES))
    return _INVISIBLE.sub("", decomposed).translate(CONFUSABLES)


@lru_cache(maxsize=65536)
def fold_char(char: str) -> str:
    """``fold`` of one character: "" (removed), one character or a few (``ﬁ`` is ``fi``)."""
    return fold(char)


def fold_with_origins(text: str, offset: int = 0) -> tuple[str, list[int]]:
    """``fold(text)`` and, for each folded character, the index (plus ``offset``) of the character of
    ``text`` it comes from: nondecreasing, so a folded span maps back to one original span."""
    if text.isascii():
        return text, list(range(offset, offset + len(text)))
    pieces: list[str] = []
    origins: list[int] = []
    for i, char in enumerate(text, offset):
        folded = char if char.isascii() else fold_char(char)
        pieces.append(folded)
        origins.extend([i] * len(folded))
    return "".join(pieces), origins
