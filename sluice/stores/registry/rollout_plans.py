"""What each rollout move writes, decided once for both backends (as ``sluice.stores.registry.changes`` does
for the other changes): pure functions from the model's state read inside the write's transaction (and
``now``) to one ``Change``: the rollout row, and, when the move changes traffic, the route and the
versions' states through ``route_change`` (so every route rule holds), with one audit row whose before
and after hold the rollout, the route and the versions that moved. The moves:
``sluice.stores.registry.rollouts``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sluice.stores.registry.base import (
    AlreadyExists,
    ChangeAction,
    InvalidChange,
    VersionState,
    check_actor,
    check_text,
    check_version_name,
)
from sluice.stores.registry.changes import Change, ModelState, PutRollout, Write, route_change
from sluice.stores.registry.rollouts import (
    Rollout,
    RolloutError,
    RolloutGuard,
    RolloutMove,
    RolloutState,
    check_steps_bp,
)

# A canary in one of these is loaded (or was): start may set it serving. A staged one has no replicas.
_STARTABLE_CANARY_STATES = frozenset({VersionState.WARMING, VersionState.SERVING, VersionState.DRAINING})


def rollout_json(r: Rollout | None) -> dict[str, Any] | None:
    """The rollout as the audit log (and the admin API) writes it."""
    if r is None:
        return None
    return {
        "stable_version": r.stable_version,
        "canary_version": r.canary_version,
        "steps_bp": list(r.steps_bp),
        "step_index": r.step_index,
        "state": str(r.state),
        "guard": None if r.guard is None else r.guard.as_json(),
        "started_by": r.started_by,
        "reason": r.reason,
    }


def _traffic_change(
    state: ModelState, before: Rollout | None, after: Rollout, action: ChangeAction, now: datetime
) -> Change[Rollout]:
    """``after``'s route and version states (canary and stable ``serving`` while active; at the end, the
    one left behind ``draining``), with the rollout row, as one change."""
    serving, draining = VersionState.SERVING, VersionState.DRAINING
    if after.state == RolloutState.COMPLETED:
        states = {after.canary_version: serving, after.stable_version: draining}
    elif after.state == RolloutState.ROLLED_BACK:
        states = {after.stable_version: serving, after.canary_version: draining}
    else:
        states = {after.canary_version: serving, after.stable_version: serving}
    route = route_change(state, after.weights_bp(), states, now)
    writes: tuple[Write, ...] = (*route.writes, PutRollout(after))
    return Change(
        action,
        state.name,
        "rollout",
        {"rollout": rollout_json(before), **route.before},
        {"rollout": rollout_json(after), **route.after},
        writes,
        after,
    )


def _stable_version(state: ModelState) -> str:
    """The version the model's route gives all its traffic; a rollout starts only from there."""
    route = state.route
    routed = [] if route is None else [e.version for e in route.entries if e.weight_bp > 0]
    if len(routed) != 1:
        shown = "no route" if route is None else f"the route {route.split_pct()} (percent)"
        raise InvalidChange(
            f"model {state.name!r} has {shown}: a rollout starts from one version at 100% "
            "(set the route to the stable version first)"
        )
    return routed[0]


def plan_start_rollout(
    state: ModelState,
    canary_version: str,
    *,
    steps_bp: Sequence[int],
    guard: RolloutGuard | None,
    actor: str,
    reason: str,
    now: datetime,
) -> Change[Rollout]:
    check_version_name(canary_version)
    check_text("reason", reason)
    try:
        steps = check_steps_bp(steps_bp)
    except RolloutError as exc:
        raise InvalidChange(str(exc)) from None
    if guard is not None and not isinstance(guard, RolloutGuard):
        raise InvalidChange(f"guard must be a RolloutGuard or None, got {type(guard).__name__}")
    canary = state.require_version(canary_version)
    previous = state.rollout
    if previous is not None and previous.is_active:
        raise AlreadyExists(
            f"model {state.name!r} already has a {previous.state} rollout ({previous.stable_version} -> "
            f"{previous.canary_version}): roll it back or let it complete first"
        )
    stable = _stable_version(state)
    if stable == canary_version:
        raise InvalidChange(f"{state.name}@{canary_version} already has all the traffic: nothing to roll out")
    if canary.state not in _STARTABLE_CANARY_STATES:
        raise InvalidChange(
            f"{state.name}@{canary_version} is {canary.state}: a canary must be loaded first "
            "(set it warming so replicas load it; start then sets it serving)"
        )
    completed = steps[0] == steps[-1]
    rollout = Rollout(
        model=state.name,
        stable_version=stable,
        canary_version=canary_version,
        steps_bp=steps,
        step_index=0,
        state=RolloutState.COMPLETED if completed else RolloutState.RUNNING,
        guard=guard,
        started_by=check_actor(actor),
        started_at=now,
        step_started_at=now,
        updated_at=now,
        finished_at=now if completed else None,
        reason=reason,
    )
    return _traffic_change(state, previous, rollout, ChangeAction.ROLLOUT_START, now)


def _unchanged(state: ModelState, rollout: Rollout) -> Change[Rollout]:
    return Change(None, state.name, "rollout", None, None, (), rollout)


def plan_move_rollout(
    state: ModelState,
    move: object,
    *,
    reason: str,
    now: datetime,
    expected_step_started_at: datetime | None = None,
) -> Change[Rollout]:
    """``move`` on the model's rollout; see ``RolloutVerbs.move_rollout``."""
    try:
        how = RolloutMove(str(move))
    except ValueError:
        raise InvalidChange(f"unknown rollout move {move!r}; valid: {', '.join(RolloutMove)}") from None
    check_text("reason", reason)
    state.require_model()
    current = state.rollout
    if current is None:
        raise InvalidChange(f"model {state.name!r} has no rollout to {how}")
    if expected_step_started_at is not None and current.step_started_at != expected_step_started_at:
        begun = current.step_started_at.isoformat()
        raise InvalidChange(
            f"{state.name}: the rollout moved since the step that was judged (now {current.state} at step "
            f"{current.step_index + 1} of {len(current.steps_bp)}, begun {begun})"
        )
    moved = dataclasses.replace(current, updated_at=now, reason=reason)
    refusal = f"{state.name}: the rollout is {current.state}, it cannot {how}"
    if how == RolloutMove.ADVANCE:
        if current.state != RolloutState.RUNNING:
            hint = " (resume it first)" if current.state == RolloutState.PAUSED else ""
            raise InvalidChange(refusal + hint)
        index = current.step_index + 1  # exists: a rollout at its last step (100%) is completed
        done = current.steps_bp[index] == current.steps_bp[-1]
        moved = dataclasses.replace(
            moved,
            step_index=index,
            step_started_at=now,
            state=RolloutState.COMPLETED if done else RolloutState.RUNNING,
            finished_at=now if done else None,
        )
        action = ChangeAction.ROLLOUT_COMPLETE if done else ChangeAction.ROLLOUT_ADVANCE
        return _traffic_change(state, current, moved, action, now)
    if how == RolloutMove.ROLLBACK:
        if current.state == RolloutState.ROLLED_BACK:
            return _unchanged(state, current)
        moved = dataclasses.replace(moved, state=RolloutState.ROLLED_BACK, finished_at=now)
        return _traffic_change(state, current, moved, ChangeAction.ROLLOUT_ROLLBACK, now)
    target, allowed_from, action = (
        (RolloutState.PAUSED, RolloutState.RUNNING, ChangeAction.ROLLOUT_PAUSE)
        if how == RolloutMove.PAUSE
        else (RolloutState.RUNNING, RolloutState.PAUSED, ChangeAction.ROLLOUT_RESUME)
    )
    if current.state == target:
        return _unchanged(state, current)
    if current.state != allowed_from:
        raise InvalidChange(refusal)
    moved = dataclasses.replace(moved, state=target)
    return Change(
        action,
        state.name,
        "rollout",
        {"rollout": rollout_json(current)},
        {"rollout": rollout_json(moved)},
        (PutRollout(moved),),
        moved,
    )
