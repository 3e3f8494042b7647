"""A model's rollout as the registry keeps it: the types, their input rules and the interface's rollout
verbs (``RolloutVerbs``, which ``sluice.stores.registry.base.Registry`` extends), apart from base.py to keep
each module small. Imports nothing from the rest of the registry, so base.py can import it.

A rollout moves a model's traffic from its stable version to a canary in steps (``steps_bp``, basis
points of the canary's share, increasing, ending at 10 000). Every move of it is ONE registry write: the
rollout record, the route and the versions' states change in the same transaction, with one generation
and one audit row (action ``rollout.*``, subject ``rollout``). What each move writes:

- start: the rollout ``running`` at step 0 (``completed`` if step 0 is 100%); the route gives the stable
  version 100% minus step 0 and the canary step 0; the canary is set ``serving`` (from ``warming`` or
  ``draining``: it must be loaded already, so a ``staged`` canary is refused).
- advance (a ``running`` rollout only): the next step, likewise; at 100% the rollout is ``completed``,
  the route names the canary alone and the stable version is set ``draining``.
- pause: ``paused``, route unchanged; the guard leaves it alone and advance is refused until resume.
- resume: ``running`` again, route unchanged.
- rollback (from ``running``, ``paused`` or ``completed``): ``rolled_back``; the route gives the stable
  version 100% and it is ``serving`` (also after a completed rollout, while the stable version is not
  retired); the canary is set ``draining``.

``draining`` is how replicas of the version left behind finish their in-flight requests and take
nothing new (the route gives the version nothing); nothing is killed.

A model keeps one rollout record, its latest: at most one is active (``running`` or ``paused``); a new
start replaces a finished one (the audit log keeps every one). While one is active the model's route
belongs to it: ``set_route`` is refused, the moves above change it.
"""

from __future__ import annotations

import builtins
import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

BASIS_POINTS_TOTAL = 10_000
MAX_STEPS = 100


class RolloutState(StrEnum):
    RUNNING = "running"  # at a step; the guard (if any) may advance or roll back
    PAUSED = "paused"  # at a step; held by a person: no advance, no guard
    COMPLETED = "completed"  # the canary has all the traffic, the stable version drains
    ROLLED_BACK = "rolled_back"  # the stable version has all the traffic again, the canary drains


ACTIVE_ROLLOUT_STATES = frozenset({RolloutState.RUNNING, RolloutState.PAUSED})


class RolloutMove(StrEnum):
    """What a person (or the guard) does to a started rollout."""

    ADVANCE = "advance"
    PAUSE = "pause"
    RESUME = "resume"
    ROLLBACK = "rollback"


class RolloutError(Exception):
    """A rollout value that breaks its rules (the registry raises it as ``InvalidChange``)."""


@dataclass(frozen=True)
class RolloutGuard:
    """The optional guard's bounds, kept with the rollout (``sluice.policy.rollout.GuardBounds`` plus how
    often to judge): the canary is rolled back when it is worse than the stable version by more than
    these, advanced when it is within them, held while either has fewer than ``min_requests`` requests
    since the step began."""

    min_requests: int = 100
    max_error_rate_increase: float = 0.01  # absolute: 0.01 is one more failed request in a hundred
    max_ttft_p95_ratio: float = 1.5
    max_itl_p95_ratio: float = 1.5
    interval_s: float = 30.0  # how often the guard judges a running rollout

    def __post_init__(self) -> None:
        if isinstance(self.min_requests, bool) or not isinstance(self.min_requests, int):
            raise RolloutError(f"guard min_requests must be a whole number, got {self.min_requests!r}")
        if self.min_requests < 1:
            raise RolloutError(f"guard min_requests must be >= 1, got {self.min_requests}")
        _check_number("guard max_error_rate_increase", self.max_error_rate_increase, 0.0, 1.0)
        _check_number("guard max_ttft_p95_ratio", self.max_ttft_p95_ratio, 1.0, 1000.0)
        _check_number("guard max_itl_p95_ratio", self.max_itl_p95_ratio, 1.0, 1000.0)
        _check_number("guard interval_s", self.interval_s, 0.1, 86_400.0)

    def as_json(self) -> dict[str, float | int]:
        return {
            "min_requests": self.min_requests,
            "max_error_rate_increase": self.max_error_rate_increase,
            "max_ttft_p95_ratio": self.max_ttft_p95_ratio,
            "max_itl_p95_ratio": self.max_itl_p95_ratio,
            "interval_s": self.interval_s,
        }

    @classmethod
    def from_json(cls, value: object) -> RolloutGuard:
        if not isinstance(value, dict) or not set(value) <= set(cls().as_json()):
            raise RolloutError(f"a guard is an object with keys {sorted(cls().as_json())}, got {value!r}")
        return cls(**value)


def _check_number(what: str, value: object, low: float, high: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise RolloutError(f"{what} must be a number in [{low}, {high}], got {value!r}")


def check_steps_bp(steps_bp: object) -> tuple[int, ...]:
    """The canary's share per step in basis points: whole numbers in (0, 10 000], strictly increasing,
    the last 10 000, at most ``MAX_STEPS`` of them."""
    if not isinstance(steps_bp, list | tuple) or not steps_bp:
        raise RolloutError(f"steps must be a non-empty list of basis points, got {steps_bp!r}")
    if len(steps_bp) > MAX_STEPS:
        raise RolloutError(f"at most {MAX_STEPS} steps, got {len(steps_bp)}")
    for step in steps_bp:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 < step <= BASIS_POINTS_TOTAL:
            raise RolloutError(f"every step must be whole basis points in (0, 10000], got {list(steps_bp)}")
    if any(b <= a for a, b in itertools.pairwise(steps_bp)):
        raise RolloutError(f"steps must increase, got {list(steps_bp)}")
    if steps_bp[-1] != BASIS_POINTS_TOTAL:
        raise RolloutError(f"the last step must be 10000 (100%), got {list(steps_bp)}")
    return tuple(steps_bp)


@dataclass(frozen=True)
class Rollout:
    """A model's latest rollout. Times are timezone-aware UTC."""

    model: str
    stable_version: str  # the version the canary replaces (and a rollback returns to)
    canary_version: str
    steps_bp: tuple[int, ...]  # the canary's share at each step, basis points, ending at 10 000
    step_index: int  # the step the route is at (the last one once completed)
    state: RolloutState
    guard: RolloutGuard | None  # None: a person moves it
    started_by: str  # the actor of the start
    started_at: datetime
    step_started_at: datetime  # when the route reached this step: the guard compares traffic since then
    updated_at: datetime
    finished_at: datetime | None  # when it completed or was rolled back
    reason: str  # why its last move, in words ("" when none was given)

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_ROLLOUT_STATES

    @property
    def canary_step_bp(self) -> int:
        """The canary's share at the current step (what the route gives it while active)."""
        return self.steps_bp[self.step_index]

    def weights_bp(self) -> dict[str, int]:
        """The route this rollout's state means (versions at weight 0 left out)."""
        if self.state == RolloutState.ROLLED_BACK:
            return {self.stable_version: BASIS_POINTS_TOTAL}
        if self.state == RolloutState.COMPLETED:
            return {self.canary_version: BASIS_POINTS_TOTAL}
        split = {
            self.stable_version: BASIS_POINTS_TOTAL - self.canary_step_bp,
            self.canary_version: self.canary_step_bp,
        }
        return {version: bp for version, bp in split.items() if bp > 0}


class RolloutVerbs(ABC):
    """The registry's rollout verbs (part of ``Registry``). Each move is one write: the rollout, the route
    and the versions' states, one generation, one audit row; refused moves write nothing. Errors as the
    rest of the registry: ``NotFound`` (model or version), ``AlreadyExists`` (a rollout of the model is
    active), ``InvalidChange`` (bad steps or guard, a move its state does not allow, the route or version
    rules), ``RegistryUnavailable``."""

    @abstractmethod
    async def start_rollout(
        self,
        model: str,
        canary_version: str,
        *,
        steps_bp: tuple[int, ...] | builtins.list[int],
        actor: str,
        guard: RolloutGuard | None = None,
        reason: str = "",
    ) -> Rollout:
        """Start moving ``model`` from the version its route gives 100% (the stable one: a route split
        over several versions is refused) to ``canary_version``, which must be ``serving``, ``warming``
        or ``draining`` (it is set ``serving`` in the same write). The route goes to step 0 at once."""

    @abstractmethod
    async def move_rollout(
        self,
        model: str,
        move: RolloutMove,
        *,
        actor: str,
        reason: str = "",
        expected_step_started_at: datetime | None = None,
    ) -> Rollout:
        """Advance (only a ``running`` rollout), pause, resume or roll back the model's rollout (see the
        module's list). Pausing a paused one, resuming a running one or rolling back a rolled-back one
        changes nothing (no generation); any other move its state does not allow is ``InvalidChange``,
        as is a model that never had a rollout. ``expected_step_started_at``: the move is for the step the
        caller judged (the guard): ``InvalidChange`` if the rollout has moved to another step (or been
        restarted) since, so a decision is never applied to a step it did not see."""

    @abstractmethod
    async def get_rollout(self, model: str) -> Rollout | None:
        """The model's latest rollout, active or finished; None if it never had one; ``NotFound`` without
        the model."""

    @abstractmethod
    async def list_rollouts(self, *, active_only: bool = False) -> builtins.list[Rollout]:
        """Every model's latest rollout (only ``running``/``paused`` ones with ``active_only``), by model."""
