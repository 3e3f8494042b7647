"""Screen streamed output as it is produced, holding back just enough that blocked text is never sent.

    screen = StreamScreen([rules], holdback_chars=64)
    for piece in pieces:
        safe, verdict = screen.feed(piece)
        send(safe)
        if verdict is not None:  # tripped: end the stream with content_filter
            break
    else:
        rest, verdict = screen.finish()

The classifiers see the text folded (``sluice.safety.fold``: NFKD, marks and invisible characters
removed, look-alike letters mapped), so ``ｂ\u200bоmb`` trips the rule for ``bomb``; what is released is
always the original text. Folding goes character by character, so the screen folds each piece as it
comes and keeps, for every folded character, the original character it came from: a decision about
folded positions releases the original characters before the corresponding one. Every count below
(holdback, window, match lengths) is in folded characters: zero-width padding inside a match cannot
stretch it past the holdback, it is simply held with it.

Each ``feed`` screens a sliding window: the last ``window_chars`` of the text already screened plus the
new text (earlier text is kept only as left context, so ``\\b`` and lookbehinds see real characters).
The last ``holdback_chars`` characters are not released: a character leaves only once it has been
screened together with at least ``holdback_chars`` characters after it, or the stream has ended.

Why that is enough: let a match cover ``[s, e)`` with ``e - s <= max_match_chars <= holdback_chars``.
Before the feed that completes it, at most ``e - 1 - holdback_chars < s`` characters were released; that
feed's window starts at or before ``s`` (``window_chars >= holdback_chars``), so it trips there and then
releases nothing. A match that runs to the very end of unfinished text is not reported yet (``bomb``
may become ``bombastic``), but its start is then within the holdback, so it is still unreleased when the
next feed (or ``finish``) decides it. A match longer than its rule's declared bound (a configured regex
that exceeds ``regex_max_match_chars``) still trips, but its first characters may have been sent.

Pure and synchronous: no clock, no I/O. One screen per stream; not thread-safe.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from sluice.safety.base import Classifier, Verdict
from sluice.safety.fold import fold_with_origins

# Characters kept before the scan start, for lookbehinds and word boundaries (the built-in rules look
# back one character; configured regexes see at least this many).
CONTEXT_CHARS = 32


class StreamScreen:
    def __init__(
        self, classifiers: Sequence[Classifier], holdback_chars: int, window_chars: int | None = None
    ) -> None:
        for c in classifiers:
            if not c.supports_streaming or c.max_match_chars is None:
                raise ValueError(
                    f"classifier {c.name!r} cannot screen a stream (not synchronous and bounded)"
                )
        required = max((c.max_match_chars or 0 for c in classifiers), default=0)
        if holdback_chars < max(1, required):
            raise ValueError(
                f"holdback_chars ({holdback_chars}) must be >= 1 and >= the longest match a rule can make "
                f"({required}), or the start of a match could be sent before the match is seen"
            )
        window = holdback_chars if window_chars is None else window_chars
        if window < holdback_chars:
            raise ValueError(f"window_chars ({window}) must be >= holdback_chars ({holdback_chars})")
        self._classifiers = tuple(classifiers)
        self.holdback_chars = holdback_chars
        self.window_chars = window
        # The original text from absolute position _base on (only what is not released yet is needed).
        self._buf = ""
        self._base = 0
        # The folded text from absolute folded position _fbase on, and for each of its characters the
        # absolute position of the original character it comes from (nondecreasing).
        self._fbuf = ""
        self._fbase = 0
        self._origins: list[int] = []
        self._num_chars = 0  # fed so far (original)
        self._num_folded = 0  # folded characters so far
        self._num_released = 0  # original characters sent
        self._scan_from = 0  # folded, absolute: no undecided match starts before this
        self._finished = False
        self.verdict: Verdict | None = None  # set once, on the trip

    @property
    def num_chars(self) -> int:
        return self._num_chars

    @property
    def num_released_chars(self) -> int:
        return self._num_released

    @property
    def num_held_chars(self) -> int:
        """Fed but not released: what a trip or an abrupt end withholds."""
        return self._num_chars - self._num_released

    def feed(self, text: str) -> tuple[str, Verdict | None]:
        """Add streamed text; return what may be sent now, and the verdict if this text tripped a rule.
        On a trip the stream ends there, so the held text before the earliest match is released with the
        verdict (nothing of any match is); later calls return ``("", verdict)``."""
        if self.verdict is not None:
            return "", self.verdict
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if not text:
            return "", None
        folded, origins = fold_with_origins(text, self._num_chars)
        self._buf += text
        self._num_chars += len(text)
        self._fbuf += folded
        self._origins.extend(origins)
        self._num_folded += len(folded)
        if self._scan(final=False):
            return self._release(self._before_earliest_match()), self.verdict
        return self._release(self._safe_upto()), None

    def finish(self) -> tuple[str, Verdict | None]:
        """The stream ended: screen the held text as final and release all of it, unless it trips."""
        if self.verdict is not None:
            return "", self.verdict
        if self._finished:
            return "", None
        self._finished = True
        if self._scan(final=True):
            return self._release(self._before_earliest_match()), self.verdict
        return self._release(self._num_chars), None

    def _original(self, folded_at: int) -> int:
        """The original position of the folded position ``folded_at``; the end of the original text for
        the end of the folded one (so trailing characters that fold to nothing go with it)."""
        if folded_at >= self._num_folded:
            return self._num_chars
        return self._origins[folded_at - self._fbase]

    def _folded_released(self) -> int:
        """The folded position of the first character not released yet."""
        return self._fbase + bisect_left(self._origins, self._num_released)

    def _safe_upto(self) -> int:
        """Release everything before the first position where a match could still begin (for the
        built-in rules, usually just the last word), and never hold more than ``holdback_chars``."""
        start = self._folded_released() - self._fbase
        upto = self._num_folded
        for classifier in self._classifiers:
            upto = min(upto, self._fbase + classifier.earliest_possible_start(self._fbuf, start))
        return self._original(max(upto, self._num_folded - self.holdback_chars))

    def _before_earliest_match(self) -> int:
        """After a trip: the original position of the earliest match any classifier sees in the held
        text, the stream taken as ended (or what was released already, if a classifier cannot say)."""
        start = self._folded_released() - self._fbase
        limit = self._num_folded
        for classifier in self._classifiers:
            try:
                found = classifier.earliest_match_start(self._fbuf, start)
            except NotImplementedError:
                return self._num_released
            if found is not None:
                limit = min(limit, self._fbase + found)
        return self._original(limit)

    def _scan(self, final: bool) -> bool:
        start = self._scan_from - self._fbase
        for classifier in self._classifiers:
            verdict = classifier.classify_window(self._fbuf, start, final)
            if verdict.blocked:
                self.verdict = verdict
                return True
        # Undecided matches (those reaching the end) start within the last max_match_chars <= window.
        self._scan_from = max(self._scan_from, self._num_folded - self.window_chars)
        return False

    def _release(self, upto: int) -> str:
        if upto <= self._num_released:
            return ""
        out = self._buf[self._num_released - self._base : upto - self._base]
        self._num_released = upto
        # Drop what neither the next scan nor its context needs; in steps, so the copy is amortised.
        if self._num_released - self._base > 4 * (self.window_chars + CONTEXT_CHARS):
            self._buf = self._buf[self._num_released - self._base :]
            self._base = self._num_released
        keep_from = min(self._scan_from, self._folded_released()) - CONTEXT_CHARS
        if keep_from - self._fbase > 4 * (self.window_chars + CONTEXT_CHARS):
            cut = keep_from - self._fbase
            self._fbuf = self._fbuf[cut:]
            del self._origins[:cut]
            self._fbase = keep_from
        return out
