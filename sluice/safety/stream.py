"""Screen streamed output as it is produced, holding back just enough that blocked text is never sent.

    screen = StreamScreen([rules], holdback_chars=64)
    for piece in pieces:
        safe, verdict = screen.feed(piece)
        send(safe)
        if verdict is not None:  # tripped: end the stream with content_filter
            break
    else:
        rest, verdict = screen.finish()

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

from collections.abc import Sequence

from sluice.safety.base import Classifier, Verdict

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
        self._buf = ""  # the text from absolute position _base on
        self._base = 0
        self._num_chars = 0  # fed so far
        self._num_released = 0
        self._scan_from = 0  # absolute: no undecided match starts before this
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
        self._buf += text
        self._num_chars += len(text)
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

    def _safe_upto(self) -> int:
        """Release everything before the first position where a match could still begin (for the
        built-in rules, usually just the last word), and never hold more than ``holdback_chars``."""
        start = self._num_released - self._base
        upto = self._num_chars
        for classifier in self._classifiers:
            upto = min(upto, self._base + classifier.earliest_possible_start(self._buf, start))
        return max(upto, self._num_chars - self.holdback_chars)

    def _before_earliest_match(self) -> int:
        """After a trip: the absolute position of the earliest match any classifier sees in the held
        text, the stream taken as ended (or what was released already, if a classifier cannot say)."""
        start = self._num_released - self._base
        limit = self._num_chars
        for classifier in self._classifiers:
            try:
                found = classifier.earliest_match_start(self._buf, start)
            except NotImplementedError:
                return self._num_released
            if found is not None:
                limit = min(limit, self._base + found)
        return limit

    def _scan(self, final: bool) -> bool:
        start = self._scan_from - self._base
        for classifier in self._classifiers:
            verdict = classifier.classify_window(self._buf, start, final)
            if verdict.blocked:
                self.verdict = verdict
                return True
        # Undecided matches (those reaching the end) start within the last max_match_chars <= window.
        self._scan_from = max(self._scan_from, self._num_chars - self.window_chars)
        return False

    def _release(self, upto: int) -> str:
        if upto <= self._num_released:
            return ""
        out = self._buf[self._num_released - self._base : upto - self._base]
        self._num_released = upto
        # Drop what neither the next scan nor its context needs; in steps, so the copy is amortised.
        keep_from = min(self._scan_from, self._num_released) - CONTEXT_CHARS
        if keep_from - self._base > 4 * (self.window_chars + CONTEXT_CHARS):
            self._buf = self._buf[keep_from - self._base :]
            self._base = keep_from
        return out
