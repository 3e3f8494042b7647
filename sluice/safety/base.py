"""The one interface every safety classifier implements, and the verdict it returns.

A classifier says whether a text may pass. Two kinds:

- cheap and synchronous (the built-in rules): ``supports_streaming`` is True, ``classify_now`` answers
  without awaiting, so the streaming screen can run it on every chunk on the event loop's hot path;
- remote (a model served by Triton, e.g. Llama Guard): only ``classify`` (awaited), used on prompts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """What a classifier decided. ``message`` is safe to show the client: it names the category and never
    echoes the text that matched (which may be the very PII or content being withheld)."""

    blocked: bool
    classifier: str  # which classifier decided, e.g. "rules" or "triton:sluice-guard"
    category: str  # "" when allowed; else e.g. "blocklist", "regex:<name>", "pii:email", "pii:card"
    message: str

    @classmethod
    def allow(cls, classifier: str) -> Verdict:
        return cls(blocked=False, classifier=classifier, category="", message="")

    @classmethod
    def block(cls, classifier: str, category: str) -> Verdict:
        return cls(
            blocked=True,
            classifier=classifier,
            category=category,
            message=f"content blocked by the safety filter (category: {category})",
        )


class ClassifierUnavailableError(RuntimeError):
    """A remote classifier could not answer (down, timed out, bad reply). The caller decides whether that
    fails the request (closed) or lets it pass (open); nothing here guesses."""


class Classifier(ABC):
    """One safety classifier. ``name`` appears in verdicts, logs and metrics."""

    name: str
    # Cheap and synchronous: classify_now/classify_window work and may run on every streamed chunk.
    supports_streaming: bool = False
    # The longest span one match can cover, in characters: what a streaming holdback must be at least.
    # None: unknown (then the classifier cannot screen a stream).
    max_match_chars: int | None = None

    @abstractmethod
    async def classify(self, text: str) -> Verdict:
        """The verdict on the whole ``text``. Remote classifiers raise ``ClassifierUnavailableError``."""

    def classify_now(self, text: str) -> Verdict:
        """The verdict on ``text`` without awaiting; only classifiers with ``supports_streaming``."""
        raise NotImplementedError(f"classifier {self.name!r} has no synchronous path")

    def classify_window(self, text: str, start: int, final: bool) -> Verdict:
        """The verdict on matches starting at or after ``start`` in ``text``, which the streaming screen
        has folded (``sluice.safety.fold``), as for ``earliest_*``; ``text[:start]`` is context only (so a
        word boundary at ``start`` is judged on the real preceding character). When ``final`` is False the
        text may still grow, so a match running up to its very end (which the next characters could
        still undo: ``bomb`` + ``astic``) is not reported yet. The default ignores both refinements."""
        return self.classify_now(text[start:])

    def earliest_possible_start(self, text: str, start: int) -> int:
        """How far a stream may be sent: the first position at or after ``start`` where a match could
        still begin if more text came. The default knows nothing better than the longest match."""
        assert self.max_match_chars is not None
        return max(start, len(text) - self.max_match_chars)

    def earliest_match_start(self, text: str, start: int) -> int | None:
        """Where the earliest match at or after ``start`` begins, ``text`` being final (None: no match).
        A stream that trips sends what comes before it. Classifiers that cannot say raise
        ``NotImplementedError``, and a tripped stream then sends nothing more."""
        raise NotImplementedError(f"classifier {self.name!r} cannot locate its matches")
