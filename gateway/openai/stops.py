"""Stop strings on streamed text: emit what cannot be the start of a stop string, hold the rest."""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        # The longest tail that could still grow into a stop string.
        self._holdback = max((len(s) for s in self._stops), default=1) - 1
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit, whether a stop string was hit). After a hit, the text ends before it."""
        if not self._stops:
            return text, False
        self._pending += text
        # The stop string that is complete first wins (earliest end; at a tie, the longer one), so the
        # result does not depend on how the text was split into pieces.
        hits = [(i + len(s), i) for s in self._stops if (i := self._pending.find(s)) >= 0]
        if hits:
            out = self._pending[: min(hits)[1]]
            self._pending = ""
            return out, True
        cut = len(self._pending) - self._holdback
        if cut <= 0:
            return "", False
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out, False

    def flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
