"""Graceful degradation under persistent overload (the seed: "if the spike persists, the service degrades
rather than fails: shorter outputs, a smaller model, or queued batch mode").

Per model, configured fallbacks (``Fallbacks``), taken only while that model is overloaded:
- ``alias_to``: serve the request with another routed model (a smaller one) the tenant may use;
- ``max_tokens_cap``: cap the request's output tokens;
- ``to_batch``: move a request that did not choose its class (no ``service_tier``, or ``auto``) to batch.

Overload (``OverloadDetector``): the model's signal (the age of its oldest waiting interactive request)
stays above ``overload_wait_s`` for ``enter_after_s``; it ends when the signal stays at or below it for
``exit_after_s`` (hysteresis, so a model does not flap in and out at every sample). The queue's age comes
before refusals: the gateway refuses a request (429 ``service_overloaded``) only once the queue ahead of it
nears its deadline, so an old oldest-waiter precedes every refusal and is the earlier signal.

Pure: configuration, state and ``now`` in, decisions out; no clock, no I/O.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any


class Action(StrEnum):
    """A fallback taken for one request (the metric's ``action`` label)."""

    ALIAS_TO = "alias_to"
    MAX_TOKENS_CAP = "max_tokens_cap"
    TO_BATCH = "to_batch"


@dataclass(frozen=True)
class Fallbacks:
    """One model's degradation: what to do while it is overloaded, and when it is."""

    alias_to: str | None = None  # another routed model (smaller), if the tenant may use it
    max_tokens_cap: int | None = None  # output tokens at most
    to_batch: bool = False  # requests that did not choose a class go to the batch class
    # Overloaded when the oldest waiting interactive request has waited longer than this...
    overload_wait_s: float = 2.0
    enter_after_s: float = 10.0  # ...for this long; and no longer once it has not for exit_after_s
    exit_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.alias_to is not None and (not isinstance(self.alias_to, str) or not self.alias_to):
            raise ValueError(f"alias_to must be a model name, got {self.alias_to!r}")
        cap = self.max_tokens_cap
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"max_tokens_cap must be an integer >= 1, got {cap!r}")
        if not isinstance(self.to_batch, bool):
            raise ValueError(f"to_batch must be true or false, got {self.to_batch!r}")
        if self.alias_to is None and cap is None and not self.to_batch:
            raise ValueError("names no fallback: give alias_to, max_tokens_cap or to_batch")
        for name in ("overload_wait_s", "enter_after_s", "exit_after_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.overload_wait_s == 0:
            raise ValueError("overload_wait_s must be > 0 (0 would call every waiting request overload)")


_FIELDS = tuple(f.name for f in fields(Fallbacks))


def parse_degradation(text: str) -> dict[str, Fallbacks]:
    """``SLUICE_DEGRADATION``'s JSON: ``{"<model>": {"max_tokens_cap": 64, "to_batch": true, ...}}``.
    Raises ``ValueError`` naming the model and the field at fault (unknown field, bad value)."""
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError('must be a JSON object of model name -> fallbacks, e.g. {"m": {"to_batch": true}}')
    config: dict[str, Fallbacks] = {}
    for model, given in raw.items():
        if not isinstance(given, dict):
            raise ValueError(f"model {model!r}: must be an object of fallbacks, got {given!r}")
        unknown = sorted(set(given) - set(_FIELDS))
        if unknown:
            known = ", ".join(_FIELDS)
            raise ValueError(f"model {model!r}: unknown field(s) {', '.join(unknown)}; known: {known}")
        try:
            fallbacks = Fallbacks(**given)
        except ValueError as exc:
            raise ValueError(f"model {model!r}: {exc}") from None
        if fallbacks.alias_to == model:
            raise ValueError(f"model {model!r}: alias_to names the model itself")
        config[model] = fallbacks
    return config


class Transition(StrEnum):
    ENTERED = "entered"
    EXITED = "exited"


class OverloadDetector:
    """One model's overload state with hysteresis, on the caller's clock. ``observe`` it with each sample
    of the signal; between samples the last one is taken to hold."""

    def __init__(self, overload_wait_s: float, enter_after_s: float, exit_after_s: float) -> None:
        self.overload_wait_s = overload_wait_s
        self.enter_after_s = enter_after_s
        self.exit_after_s = exit_after_s
        self.overloaded = False
        self.changed_at_s: float | None = None  # when it last entered or left overload
        # When the signal started to disagree with the state (above while not overloaded, at or below
        # while overloaded); None: it agrees.
        self._streak_since_s: float | None = None

    def observe(self, now_s: float, oldest_wait_s: float) -> Transition | None:
        """Take a sample of the signal; the transition it causes, if any."""
        above = oldest_wait_s > self.overload_wait_s
        if above != self.overloaded:
            if self._streak_since_s is None:
                self._streak_since_s = now_s
            hold_s = self.exit_after_s if self.overloaded else self.enter_after_s
            if now_s - self._streak_since_s >= hold_s:
                self.overloaded = above
                self.changed_at_s = now_s
                self._streak_since_s = None
                return Transition.ENTERED if above else Transition.EXITED
        else:
            self._streak_since_s = None
        return None


@dataclass(frozen=True)
class Degraded:
    """The fallbacks one request of an overloaded model is subject to. The cap changes a request only if it
    would get more output tokens than the cap; ``taken`` and ``header`` name what changed."""

    alias_to: str | None = None  # served by this model instead
    max_tokens_cap: int | None = None
    to_batch: bool = False

    def capped(self, max_tokens: int) -> int:
        return max_tokens if self.max_tokens_cap is None else min(max_tokens, self.max_tokens_cap)

    def taken(self, max_tokens: int) -> tuple[Action, ...]:
        """The fallbacks that change a request that would get ``max_tokens`` output tokens uncapped."""
        cap = self.max_tokens_cap
        changed = (
            (Action.ALIAS_TO, self.alias_to is not None),
            (Action.MAX_TOKENS_CAP, cap is not None and max_tokens > cap),
            (Action.TO_BATCH, self.to_batch),
        )
        return tuple(action for action, is_changed in changed if is_changed)

    def header(self, max_tokens: int) -> str:
        """The ``Sluice-Degraded`` header's value, e.g. ``alias_to=small, max_tokens_cap=64, to_batch``;
        empty when nothing changed."""
        values = {Action.ALIAS_TO: self.alias_to, Action.MAX_TOKENS_CAP: self.max_tokens_cap}
        return ", ".join(
            str(a) if a is Action.TO_BATCH else f"{a}={values[a]}" for a in self.taken(max_tokens)
        )


def degrade(
    fallbacks: Fallbacks, *, alias_allowed: bool, class_chosen: bool, batch_allowed: bool
) -> Degraded:
    """The fallbacks a request of an overloaded model is subject to. ``alias_allowed``: ``alias_to`` is
    routed and the tenant may use it; ``class_chosen``: the request named its class (a ``service_tier``
    other than auto); ``batch_allowed``: the tenant may use the batch class."""
    return Degraded(
        alias_to=fallbacks.alias_to if alias_allowed else None,
        max_tokens_cap=fallbacks.max_tokens_cap,
        to_batch=fallbacks.to_batch and not class_chosen and batch_allowed,
    )
