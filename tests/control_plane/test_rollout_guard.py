"""The rollout guard: its judgement from the ledger's per-version traffic (pure), one pass over a real
registry and a ledger filled directly (hold while too few requests, advance within the bounds, roll back
past one, only when due, never a paused rollout; actor "guard", the reason kept and audited), and the
running service rolling back a bad canary by itself."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from release_helpers import DIGEST, bearer, make_tokens, usage_rows, write_usage

from control_plane.service.app import create_app
from control_plane.service.rollout_guard import GUARD_ACTOR, RolloutGuardTask, judge
from sluice.policy.rollout import GuardAction
from sluice.settings import load_settings
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.ledger.base import VersionTraffic
from sluice.stores.ledger.store import SqliteLedger
from sluice.stores.registry.base import ChangeAction, VersionState
from sluice.stores.registry.rollouts import Rollout, RolloutGuard, RolloutMove, RolloutState
from sluice.stores.registry.sqlite import SqliteRegistry

GUARD = RolloutGuard(min_requests=10, max_error_rate_increase=0.05, max_ttft_p95_ratio=1.5, interval_s=0.1)
STEPS = (1_000, 5_000, 10_000)


def _rollout(guard: RolloutGuard | None = GUARD) -> Rollout:
    at = datetime.now(UTC)
    return Rollout("tiny", "v1", "v2", STEPS, 0, RolloutState.RUNNING, guard, "a", at, at, at, None, "")


def _traffic(version: str, n: int, errors: int = 0, ttft: float | None = 100.0) -> VersionTraffic:
    return VersionTraffic(version, n, errors, 10 * n, 5 * n, ttft, 20.0)


@pytest.mark.parametrize(
    ("traffic", "action", "words"),
    [
        ([], GuardAction.HOLD, "0 requests"),
        ([_traffic("v1", 100), _traffic("v2", 9)], GuardAction.HOLD, "10 needed"),
        ([_traffic("v1", 100), _traffic("v2", 10)], GuardAction.ADVANCE, "within every bound"),
        ([_traffic("v1", 100, 1), _traffic("v2", 10, 1)], GuardAction.ROLLBACK, "error rate"),
        ([_traffic("v1", 100), _traffic("v2", 10, ttft=151.0)], GuardAction.ROLLBACK, "TTFT p95"),
        # No latency measured for a version: latency is not judged, the error rate still is.
        ([_traffic("v1", 100, ttft=None), _traffic("v2", 10)], GuardAction.ADVANCE, "within"),
        ([_traffic("v1", 100), _traffic("v2", 10), _traffic("v0", 500, 500)], GuardAction.ADVANCE, "within"),
    ],
)
def test_judge(traffic: list[VersionTraffic], action: GuardAction, words: str) -> None:
    decision = judge(_rollout(), traffic)
    assert decision.action == action and words in decision.reason


def test_judge_needs_a_guard() -> None:
    with pytest.raises(ValueError, match="no guard"):
        judge(_rollout(guard=None), [])


@dataclass
class Fleet:
    registry: SqliteRegistry
    ledger: SqliteLedger
    guard: RolloutGuardTask

    async def record(self, version: str, *, num_ok: int, num_failed: int = 0, ttft_ms: float = 100) -> None:
        for row in usage_rows("tiny", version, num_ok=num_ok, num_failed=num_failed, ttft_ms=ttft_ms):
            assert await self.ledger.record(row)

    async def rollout(self) -> Rollout:
        found = await self.registry.get_rollout("tiny")
        assert found is not None
        return found


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    """tiny: v1 serving at 100%, v2 warming, in a real registry; an empty ledger on the same file."""
    registry, ledger = SqliteRegistry(tmp_path / "sluice.db"), SqliteLedger(tmp_path / "sluice.db")
    await registry.open()
    await ledger.open()
    await registry.create_model("tiny", actor="ci")
    for version in ("v1", "v2"):
        await registry.add_version(
            "tiny",
            version,
            artifact_uri=f"s3://m/{version}",
            weights_digest=DIGEST,
            build_config={},
            actor="ci",
        )
    for version, state in (
        ("v1", VersionState.WARMING),
        ("v1", VersionState.SERVING),
        ("v2", VersionState.WARMING),
    ):
        await registry.set_version_state("tiny", version, state, actor="ci")
    await registry.set_route("tiny", {"v1": 10_000}, actor="ci")
    yield Fleet(registry, ledger, RolloutGuardTask(registry, ledger))
    await ledger.close()
    await registry.close()


@pytest.mark.anyio
async def test_one_pass_holds_then_advances_then_rolls_back(fleet: Fleet) -> None:
    await fleet.registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice", guard=GUARD)
    step0 = await fleet.rollout()
    early = step0.step_started_at + timedelta(seconds=0.05)
    assert await fleet.guard.check_once(now=early) == []  # not due before its interval

    due = step0.step_started_at + timedelta(seconds=1)
    (held,) = await fleet.guard.check_once(now=due)
    assert (held.action, held.applied, held.step_index) == (GuardAction.HOLD, False, 0)
    assert "0 requests" in held.reason and (await fleet.rollout()).step_index == 0
    assert await fleet.guard.check_once(now=due + timedelta(seconds=0.05)) == []  # one interval per verdict

    await fleet.record("v1", num_ok=100)
    await fleet.record("v2", num_ok=12)
    generation = await fleet.registry.generation()
    (advanced,) = await fleet.guard.check_once(now=due + timedelta(seconds=1))
    assert (advanced.action, advanced.applied) == (GuardAction.ADVANCE, True)
    step1 = await fleet.rollout()
    assert step1.step_index == 1 and await fleet.registry.generation() == generation + 1
    (entry,) = await fleet.registry.audit(limit=1)
    assert (entry.actor, entry.action) == (GUARD_ACTOR, ChangeAction.ROLLOUT_ADVANCE)
    assert step1.reason == "guard: within every bound"

    # The new step compares only its own traffic: the rows above are older than it.
    (held_again,) = await fleet.guard.check_once(now=step1.step_started_at + timedelta(seconds=1))
    assert held_again.action == GuardAction.HOLD

    await fleet.record("v1", num_ok=100)
    await fleet.record("v2", num_ok=10, num_failed=5)
    (rolled_back,) = await fleet.guard.check_once(now=held_again.at + timedelta(seconds=1))
    assert (rolled_back.action, rolled_back.applied) == (GuardAction.ROLLBACK, True)
    final = await fleet.rollout()
    assert final.state == RolloutState.ROLLED_BACK and "error rate" in final.reason
    route = await fleet.registry.get_route("tiny")
    assert route is not None and route.split_pct() == {"v1": 100.0}
    assert {v.version: v.state for v in await fleet.registry.list_versions("tiny")} == {
        "v1": VersionState.SERVING,
        "v2": VersionState.DRAINING,
    }
    (entry,) = await fleet.registry.audit(limit=1)
    assert (entry.actor, entry.action) == (GUARD_ACTOR, ChangeAction.ROLLOUT_ROLLBACK)
    assert await fleet.guard.check_once(now=datetime.now(UTC) + timedelta(seconds=10)) == []  # finished


@pytest.mark.anyio
async def test_paused_and_unguarded_rollouts_are_left_alone(fleet: Fleet) -> None:
    await fleet.registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice")
    await fleet.record("v1", num_ok=100)
    await fleet.record("v2", num_ok=10, num_failed=10)
    later = datetime.now(UTC) + timedelta(seconds=10)
    assert await fleet.guard.check_once(now=later) == []  # no guard: people move it

    await fleet.registry.move_rollout("tiny", RolloutMove.ROLLBACK, actor="alice")
    await fleet.registry.start_rollout("tiny", "v2", steps_bp=STEPS, actor="alice", guard=GUARD)
    await fleet.registry.move_rollout("tiny", RolloutMove.PAUSE, actor="alice")
    await fleet.record("v2", num_ok=10, num_failed=10)
    assert await fleet.guard.check_once(now=later) == []
    assert (await fleet.rollout()).state == RolloutState.PAUSED


def test_the_running_service_rolls_a_bad_canary_back(clean_env: Path) -> None:
    settings = load_settings()
    rm = bearer(make_tokens(settings)[Role.RELEASE_MANAGER])
    api = "/admin/v1/models/tiny"
    with TestClient(create_app(settings)) as client:
        assert client.post("/admin/v1/models", json={"name": "tiny"}, headers=rm).status_code == 201
        for version in ("v1", "v2"):
            body = {"version": version, "artifact_uri": f"s3://m/{version}", "weights_digest": DIGEST}
            assert client.post(f"{api}/versions", json=body, headers=rm).status_code == 201
        for version, state in (("v1", "warming"), ("v1", "serving"), ("v2", "warming")):
            assert (
                client.post(f"{api}/versions/{version}/state", json={"state": state}, headers=rm).status_code
                == 200
            )
        assert client.put(f"{api}/route", json={"weights_bp": {"v1": 10_000}}, headers=rm).status_code == 200
        guard: dict[str, Any] = {"min_requests": 5, "interval_s": 0.2}
        start = {"version": "v2", "steps_bp": [1_000, 10_000], "guard": guard}
        assert client.post(f"{api}/rollout", json=start, headers=rm).status_code == 201

        # The gateways' rows land in the ledger: the canary fails a third of its requests.
        write_usage(
            settings, usage_rows("tiny", "v1", num_ok=50) + usage_rows("tiny", "v2", num_ok=10, num_failed=5)
        )
        deadline = time.monotonic() + 15
        while (status := client.get(f"{api}/rollout", headers=rm).json())["rollout"]["state"] == "running":
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
        assert status["rollout"]["state"] == "rolled_back"
        assert status["route"] == [{"version": "v1", "weight_bp": 10_000}]
        assert status["guard_last"]["action"] == "rollback" and status["guard_last"]["applied"] is True
        audit = client.get("/admin/v1/audit", params={"model": "tiny", "limit": 1}, headers=rm).json()
        assert (audit[0]["actor"], audit[0]["action"]) == ("guard", "rollout.rollback")
        assert "error rate" in audit[0]["after"]["rollout"]["reason"]
