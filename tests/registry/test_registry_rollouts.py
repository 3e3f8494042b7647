"""The registry's rollouts, over every backend (SQLite and PostgreSQL): each move is one write (the rollout,
the route and the versions' states, one generation, one audit row); the steps, the completion and the
rollback (from a step and from a completed rollout); at most one active rollout per model and the route
owned by it meanwhile; the canary's states a start takes; refused moves write nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sluice.stores.registry.base import (
    AlreadyExists,
    ChangeAction,
    InvalidChange,
    NotFound,
    Registry,
    VersionState,
)
from sluice.stores.registry.rollouts import Rollout, RolloutError, RolloutGuard, RolloutMove, RolloutState

pytestmark = pytest.mark.anyio

DIGEST = "sha256:" + "ef" * 32
S = VersionState
STEPS = (100, 1_000, 5_000, 10_000)  # 1%, 10%, 50%, 100%


async def add(registry: Registry, version: str, *states: VersionState, model: str = "tiny") -> None:
    await registry.add_version(
        model, version, artifact_uri=f"s3://m/{version}", weights_digest=DIGEST, build_config={}, actor="ci"
    )
    for state in states:
        await registry.set_version_state(model, version, state, actor="ci")


async def model_with_stable_v1(registry: Registry, *canary_states: VersionState) -> None:
    """tiny: v1 serving with all the traffic; v2 with ``canary_states`` applied (default: warming)."""
    await registry.create_model("tiny", actor="ci")
    await add(registry, "v1", S.WARMING, S.SERVING)
    await add(registry, "v2", *(canary_states or (S.WARMING,)))
    await registry.set_route("tiny", {"v1": 10_000}, actor="ci")


async def states(registry: Registry) -> dict[str, VersionState]:
    return {v.version: v.state for v in await registry.list_versions("tiny")}


async def route(registry: Registry) -> dict[str, int]:
    found = await registry.get_route("tiny")
    assert found is not None
    return {e.version: e.weight_bp for e in found.entries}


async def test_a_rollout_steps_to_completion_one_write_each(registry: Registry) -> None:
    await model_with_stable_v1(registry)
    assert await registry.get_rollout("tiny") is None
    before = await registry.generation()

    started = await registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice", reason="new weights")
    assert await registry.generation() == before + 1
    assert (started.stable_version, started.canary_version, started.steps_bp) == ("v1", "v2", STEPS)
    assert (started.state, started.step_index, started.canary_step_bp) == (RolloutState.RUNNING, 0, 100)
    assert (started.started_by, started.reason, started.guard, started.finished_at) == (
        "alice",
        "new weights",
        None,
        None,
    )
    assert abs(started.started_at - datetime.now(UTC)) < timedelta(seconds=30)
    assert await route(registry) == {"v1": 9_900, "v2": 100}
    assert await states(registry) == {"v1": S.SERVING, "v2": S.SERVING}  # warming -> serving in the start
    assert await registry.get_rollout("tiny") == started

    (entry,) = await registry.audit(limit=1)
    assert (entry.action, entry.actor, entry.subject, entry.model) == (
        ChangeAction.ROLLOUT_START,
        "alice",
        "rollout",
        "tiny",
    )
    assert entry.before == {"rollout": None, "route": {"v1": 10_000}, "versions": {"v2": "warming"}}
    assert entry.after["route"] == {"v1": 9_900, "v2": 100} and entry.after["versions"] == {"v2": "serving"}
    assert entry.after["rollout"]["state"] == "running" and entry.after["rollout"]["steps_bp"] == list(STEPS)

    advanced = await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="bob")
    assert (advanced.step_index, advanced.state) == (1, RolloutState.RUNNING)
    assert advanced.step_started_at > started.step_started_at and advanced.started_by == "alice"
    assert await route(registry) == {"v1": 9_000, "v2": 1_000}
    await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="bob")
    assert await route(registry) == {"v1": 5_000, "v2": 5_000}

    gen = await registry.generation()
    done = await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="bob")
    assert await registry.generation() == gen + 1
    assert (done.state, done.step_index, done.finished_at is not None) == (RolloutState.COMPLETED, 3, True)
    assert await route(registry) == {"v2": 10_000}
    assert await states(registry) == {"v1": S.DRAINING, "v2": S.SERVING}  # v1 drains, nothing killed
    (entry,) = await registry.audit(limit=1)
    assert entry.action == ChangeAction.ROLLOUT_COMPLETE and entry.after["versions"] == {"v1": "draining"}
    assert [e.action for e in await registry.audit(limit=4)] == [
        ChangeAction.ROLLOUT_COMPLETE,
        ChangeAction.ROLLOUT_ADVANCE,
        ChangeAction.ROLLOUT_ADVANCE,
        ChangeAction.ROLLOUT_START,
    ]
    with pytest.raises(InvalidChange, match="completed"):
        await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="bob")
    assert await registry.list_rollouts(active_only=True) == []
    assert await registry.list_rollouts() == [done]


async def test_a_rollback_is_one_write_one_generation(registry: Registry) -> None:
    await model_with_stable_v1(registry)
    await registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice")
    await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="alice")
    before = await registry.generation()

    back = await registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="oncall", reason="p95 doubled")
    assert await registry.generation() == before + 1
    assert (back.state, back.reason, back.finished_at is not None) == (
        RolloutState.ROLLED_BACK,
        "p95 doubled",
        True,
    )
    assert await route(registry) == {"v1": 10_000}
    assert await states(registry) == {"v1": S.SERVING, "v2": S.DRAINING}
    changes = await registry.changes(after_generation=before)
    assert len(changes) == 1 and changes[0].action == ChangeAction.ROLLOUT_ROLLBACK
    assert changes[0].before["route"] == {"v1": 9_000, "v2": 1_000}
    assert changes[0].after["route"] == {"v1": 10_000}
    assert changes[0].after["versions"] == {"v2": "draining"}
    assert changes[0].after["rollout"]["reason"] == "p95 doubled"

    # Again: nothing to do, nothing written.
    assert await registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="oncall") == back
    assert await registry.generation() == before + 1


async def test_a_completed_rollout_rolls_back_while_the_stable_version_is_not_retired(
    registry: Registry,
) -> None:
    await model_with_stable_v1(registry)
    await registry.start_rollout("tiny", "v2", steps_bp=(10_000,), actor="alice")
    assert (await registry.get_rollout("tiny") or pytest.fail()).state == RolloutState.COMPLETED
    assert await states(registry) == {"v1": S.DRAINING, "v2": S.SERVING}
    before = await registry.generation()
    await registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="oncall")
    assert await registry.generation() == before + 1
    assert await route(registry) == {"v1": 10_000}
    assert await states(registry) == {"v1": S.SERVING, "v2": S.DRAINING}

    # Completed again, and the version left behind retired: there is no way back to it.
    await registry.start_rollout("tiny", "v2", steps_bp=(10_000,), actor="alice")
    await registry.set_version_state("tiny", "v1", S.RETIRED, actor="ci")
    gen = await registry.generation()
    with pytest.raises(InvalidChange, match="retired"):
        await registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="oncall")
    assert await registry.generation() == gen


async def test_pause_holds_the_step_and_resume_continues(registry: Registry) -> None:
    await model_with_stable_v1(registry)
    await registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice")
    before = await registry.generation()
    paused = await registry.move_rollout("tiny", RolloutMove.PAUSE, actor="bob")
    assert paused.state == RolloutState.PAUSED and await registry.generation() == before + 1
    assert await route(registry) == {"v1": 9_900, "v2": 100}
    (entry,) = await registry.audit(limit=1)
    assert entry.action == ChangeAction.ROLLOUT_PAUSE and set(entry.after) == {"rollout"}
    assert await registry.move_rollout("tiny", RolloutMove.PAUSE, actor="bob") == paused  # no change
    assert await registry.generation() == before + 1
    with pytest.raises(InvalidChange, match="resume it first"):
        await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="bob")
    assert await registry.list_rollouts(active_only=True) == [paused]

    resumed = await registry.move_rollout("tiny", RolloutMove.RESUME, actor="bob")
    assert resumed.state == RolloutState.RUNNING and resumed.step_index == 0
    assert resumed.step_started_at == paused.step_started_at  # the step did not restart
    assert (await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="bob")).step_index == 1
    # A paused rollout may be rolled back.
    await registry.move_rollout("tiny", RolloutMove.PAUSE, actor="bob")
    assert (await registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="bob")).state == "rolled_back"


async def test_a_move_for_a_step_no_longer_current_is_refused(registry: Registry) -> None:
    """The guard judges one step's traffic: its decision must not land on a later step (a person advanced
    meanwhile) or a restarted rollout."""
    await model_with_stable_v1(registry)
    judged = await registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice")
    await registry.move_rollout("tiny", RolloutMove.ADVANCE, actor="alice")
    gen = await registry.generation()
    for move in (RolloutMove.ADVANCE, RolloutMove.ROLLBACK):
        with pytest.raises(InvalidChange, match="moved since"):
            await registry.move_rollout(
                "tiny", move, actor="guard", expected_step_started_at=judged.step_started_at
            )
    assert await registry.generation() == gen
    current = await registry.get_rollout("tiny")
    assert current is not None and current.step_index == 1
    moved = await registry.move_rollout(
        "tiny", RolloutMove.ADVANCE, actor="guard", expected_step_started_at=current.step_started_at
    )
    assert moved.step_index == 2 and await registry.generation() == gen + 1


async def test_the_guard_is_kept_with_the_rollout(registry: Registry) -> None:
    await model_with_stable_v1(registry)
    guard = RolloutGuard(min_requests=50, max_error_rate_increase=0.02, max_ttft_p95_ratio=1.2, interval_s=5)
    started = await registry.start_rollout("tiny", "v2", steps_bp=[500, 10_000], actor="a", guard=guard)
    assert started.guard == guard and (await registry.get_rollout("tiny") or pytest.fail()).guard == guard
    (entry,) = await registry.audit(limit=1)
    assert entry.after["rollout"]["guard"]["min_requests"] == 50


async def test_one_active_rollout_per_model_and_it_owns_the_route(registry: Registry) -> None:
    await model_with_stable_v1(registry)
    await add(registry, "v3", S.WARMING, S.SERVING)
    await registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice")
    gen = await registry.generation()
    with pytest.raises(AlreadyExists, match="already has a running rollout"):
        await registry.start_rollout("tiny", "v3", steps_bp=STEPS, actor="bob")
    with pytest.raises(InvalidChange, match="rollout"):
        await registry.set_route("tiny", {"v1": 10_000}, actor="bob")
    with pytest.raises(InvalidChange, match="must be serving"):  # the canary is routed
        await registry.set_version_state("tiny", "v2", S.DRAINING, actor="bob")
    assert await registry.generation() == gen

    # Finished, a new one may start (from the route as it is), replacing the record.
    await registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="alice")
    second = await registry.start_rollout("tiny", "v3", steps_bp=STEPS, actor="bob")
    assert (second.stable_version, second.canary_version, second.started_by) == ("v1", "v3", "bob")
    assert await registry.get_rollout("tiny") == second
    (entry,) = await registry.audit(limit=1)
    assert entry.before["rollout"]["state"] == "rolled_back"

    # Another model's rollout is its own.
    await registry.create_model("small", actor="ci")
    await add(registry, "a", S.WARMING, S.SERVING, model="small")
    await add(registry, "b", S.WARMING, model="small")
    await registry.set_route("small", {"a": 10_000}, actor="ci")
    await registry.start_rollout("small", "b", steps_bp=STEPS, actor="carol")
    assert [r.model for r in await registry.list_rollouts(active_only=True)] == ["small", "tiny"]


async def test_a_draining_canary_may_start_again(registry: Registry) -> None:
    await model_with_stable_v1(registry)
    await registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice")
    await registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="alice")
    assert (await states(registry))["v2"] == S.DRAINING
    again = await registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice")
    assert again.state == RolloutState.RUNNING and (await states(registry))["v2"] == S.SERVING


Call = Callable[[], Awaitable[Any]]


async def _refusals(registry: Registry) -> list[tuple[str, str, Call]]:
    """tiny: v1 serving at 100%, v2 warming, v3 staged, v4 retired; small: v1 serving, no route; mixed:
    a route split over two versions. One call per rule: (what, the refusal's words, the call)."""
    await model_with_stable_v1(registry)
    await add(registry, "v3")
    await add(registry, "v4", S.RETIRED)
    await registry.create_model("small", actor="ci")
    await add(registry, "v1", S.WARMING, S.SERVING, model="small")
    await add(registry, "v2", S.WARMING, model="small")
    await registry.create_model("mixed", actor="ci")
    for version in ("a", "b", "c"):
        await add(registry, version, S.WARMING, S.SERVING, model="mixed")
    await registry.set_route("mixed", {"a": 5_000, "b": 5_000}, actor="ci")
    move = registry.move_rollout
    text_steps: Any = "1,10,100"
    not_a_guard: Any = {"min_requests": 1}
    unknown_move: Any = "jump"

    def start(model: str, canary: str, steps: Any = STEPS, actor: str = "a", guard: Any = None) -> Call:
        return lambda: registry.start_rollout(model, canary, steps_bp=steps, actor=actor, guard=guard)

    return [
        ("a staged canary", "is staged", start("tiny", "v3")),
        ("a retired canary", "is retired", start("tiny", "v4")),
        ("the stable as canary", "already has all the traffic", start("tiny", "v1")),
        ("an unknown canary", "no version", start("tiny", "v9")),
        ("an unknown model", "no model", start("nope", "v2")),
        ("a model without a route", "no route", start("small", "v2")),
        ("a split route", "one version at 100%", start("mixed", "c")),
        ("steps not ending at 100%", "last step", start("tiny", "v2", [100, 5_000])),
        ("decreasing steps", "increase", start("tiny", "v2", [500, 100, 10_000])),
        ("a zero step", "basis points", start("tiny", "v2", [0, 10_000])),
        ("a fractional step", "basis points", start("tiny", "v2", [0.5, 10_000])),
        ("no steps", "non-empty", start("tiny", "v2", [])),
        ("steps as text", "non-empty list", start("tiny", "v2", text_steps)),
        ("a guard of the wrong type", "RolloutGuard", start("tiny", "v2", guard=not_a_guard)),
        ("a blank actor", "actor", start("tiny", "v2", actor=" ")),
        ("a move without a rollout", "no rollout", lambda: move("tiny", RolloutMove.ADVANCE, actor="a")),
        ("a resume without a rollout", "no rollout", lambda: move("tiny", RolloutMove.RESUME, actor="a")),
        ("an unknown move", "unknown rollout move", lambda: move("tiny", unknown_move, actor="a")),
        ("a move on no model", "no model", lambda: move("nope", RolloutMove.PAUSE, actor="a")),
    ]


async def test_refused_rollout_changes_write_nothing(registry: Registry) -> None:
    for what, words, call in await _refusals(registry):
        before, audit_before = await registry.snapshot(), await registry.audit(limit=1000)
        with pytest.raises((InvalidChange, NotFound), match=words):
            await call()
        assert await registry.snapshot() == before, what
        assert await registry.audit(limit=1000) == audit_before, what
        assert await registry.get_rollout("tiny") is None, what


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"min_requests": 0}, "min_requests"),
        ({"min_requests": 1.5}, "whole number"),
        ({"max_error_rate_increase": -0.1}, "max_error_rate_increase"),
        ({"max_ttft_p95_ratio": 0.5}, "max_ttft_p95_ratio"),
        ({"max_itl_p95_ratio": float("nan")}, "max_itl_p95_ratio"),
        ({"interval_s": 0}, "interval_s"),
    ],
)
def test_guard_bounds_are_checked(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(RolloutError, match=words):
        RolloutGuard(**kwargs)


def test_a_rollouts_route_at_each_state() -> None:
    at = datetime.now(UTC)
    r = Rollout("tiny", "v1", "v2", STEPS, 1, RolloutState.PAUSED, None, "a", at, at, at, None, "")
    assert r.weights_bp() == {"v1": 9_000, "v2": 1_000} and r.is_active
    assert replace(r, state=RolloutState.COMPLETED).weights_bp() == {"v2": 10_000}
    assert replace(r, state=RolloutState.ROLLED_BACK).weights_bp() == {"v1": 10_000}
    assert replace(r, step_index=3).weights_bp() == {"v2": 10_000}  # 100%: the stable one left out
