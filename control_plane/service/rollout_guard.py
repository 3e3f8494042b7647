"""The rollout guard: a background task of the control plane that, for each running rollout with a guard,
every ``guard.interval_s`` reads both versions' live traffic since the step began from the usage ledger
(``version_traffic``) and applies ``sluice.policy.rollout.guard_decision``: advance, hold, or roll back.
Its moves are the registry's (actor ``guard``, the decision's reason kept with the rollout and in the
audit log), made only for the step it judged (``expected_step_started_at``), so a person moving the
rollout meanwhile wins and the guard judges the new step next time. Every decision is logged; the last
per model is kept for ``GET .../rollout``.

Paused, completed and rolled-back rollouts are left alone. The guard holds no state a restart would miss:
the step's start time is the registry's, so another control plane (or this one restarted) judges the
same window. (Two control planes both guarding make at most one move per step: the second is refused.)

``open_rollout_services`` opens the usage ledger beside the registry and starts the guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sluice.policy.rollout import GuardAction, GuardBounds, GuardDecision, VersionStats, guard_decision
from sluice.settings import Settings
from sluice.stores.ledger.base import LedgerUnavailable, UsageLedger, VersionTraffic
from sluice.stores.openers import open_ledger
from sluice.stores.registry.base import InvalidChange, Registry, RegistryError, RegistryUnavailable
from sluice.stores.registry.rollouts import Rollout, RolloutMove, RolloutState

log = logging.getLogger("sluice.control_plane.guard")

GUARD_ACTOR = "guard"
TICK_S = 0.5  # how often the task looks for rollouts due a judgement (each has its own interval_s)


@dataclass(frozen=True)
class GuardVerdict:
    """One judgement: when, of which step, what was decided and whether the registry took it."""

    at: datetime
    step_index: int
    action: GuardAction
    reason: str
    applied: bool  # False: a hold, or a move the registry refused (the rollout moved meanwhile)


def stats_of(traffic: VersionTraffic | None) -> VersionStats:
    """A version's traffic as the policy takes it. NOTE: a p95 the ledger could not measure (no row had
    one) is 0, which ``guard_decision`` skips: latency cannot be judged, errors and counts still are."""
    if traffic is None:
        return VersionStats(num_requests=0, num_errors=0, ttft_p95_ms=0.0, itl_p95_ms=0.0)
    return VersionStats(
        num_requests=traffic.num_requests,
        num_errors=traffic.num_errors,
        ttft_p95_ms=traffic.ttft_p95_ms or 0.0,
        itl_p95_ms=traffic.itl_p95_ms or 0.0,
    )


def judge(rollout: Rollout, traffic: Sequence[VersionTraffic]) -> GuardDecision:
    """The guard's decision on ``rollout`` (which has a guard) from its versions' traffic in the step."""
    if rollout.guard is None:
        raise ValueError(f"the rollout of {rollout.model} has no guard")
    by_version = {t.model_version: t for t in traffic}
    g = rollout.guard
    bounds = GuardBounds(
        min_requests=g.min_requests,
        max_error_rate_increase=g.max_error_rate_increase,
        max_ttft_p95_ratio=g.max_ttft_p95_ratio,
        max_itl_p95_ratio=g.max_itl_p95_ratio,
    )
    stable = stats_of(by_version.get(rollout.stable_version))
    return guard_decision(stable, stats_of(by_version.get(rollout.canary_version)), bounds)


@dataclass
class RolloutGuardTask:
    """Judges due rollouts every ``tick_s``; ``check_once`` is one pass (what the task runs, and what a
    test calls directly)."""

    registry: Registry
    ledger: UsageLedger
    tick_s: float = TICK_S
    last_verdicts: dict[str, GuardVerdict] = field(default_factory=dict)  # by model
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="rollout-guard")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except RegistryUnavailable as exc:
                # NOTE: the registry's store reports its outage once each way (sluice.outages).
                log.debug("rollout guard: the registry is unavailable, retrying: %s", exc)
            except Exception:  # NOTE: the guard must outlive a bug in one pass; it is logged loudly
                log.exception("rollout guard: a pass failed")
            await asyncio.sleep(self.tick_s)

    def _due(self, rollout: Rollout, now: datetime) -> bool:
        if rollout.guard is None or rollout.state != RolloutState.RUNNING:
            return False
        # NOTE: a step's first judgement waits one interval from its start, as every later one does.
        last_at = rollout.step_started_at
        last = self.last_verdicts.get(rollout.model)
        if last is not None and last.step_index == rollout.step_index and last.at > last_at:
            last_at = last.at
        return (now - last_at).total_seconds() >= rollout.guard.interval_s

    async def check_once(self, now: datetime | None = None) -> list[GuardVerdict]:
        """Judge every running, guarded rollout whose interval has passed; the verdicts made."""
        now = now or datetime.now(UTC)
        verdicts = []
        for rollout in await self.registry.list_rollouts(active_only=True):
            if self._due(rollout, now):
                verdict = await self._judge_and_move(rollout, now)
                if verdict is not None:
                    verdicts.append(verdict)
        return verdicts

    async def _judge_and_move(self, rollout: Rollout, now: datetime) -> GuardVerdict | None:
        try:
            traffic = await self.ledger.version_traffic(rollout.model, rollout.step_started_at)
        except LedgerUnavailable as exc:
            log.warning(
                "rollout guard: %s not judged, the usage ledger is unavailable: %s", rollout.model, exc
            )
            return None
        decision = judge(rollout, traffic)
        applied = False
        if decision.action != GuardAction.HOLD:
            move = RolloutMove.ADVANCE if decision.action == GuardAction.ADVANCE else RolloutMove.ROLLBACK
            try:
                await self.registry.move_rollout(
                    rollout.model,
                    move,
                    actor=GUARD_ACTOR,
                    reason=f"guard: {decision.reason}",
                    expected_step_started_at=rollout.step_started_at,
                )
                applied = True
            except InvalidChange as exc:  # moved by someone else since it was read, or a rule refuses
                log.warning("rollout guard: %s %s not applied: %s", move, rollout.model, exc)
            except RegistryError as exc:
                log.warning("rollout guard: %s %s failed: %s", move, rollout.model, exc)
        verdict = GuardVerdict(now, rollout.step_index, decision.action, decision.reason, applied)
        self.last_verdicts[rollout.model] = verdict
        log.info(
            "rollout guard: %s %s -> %s at step %d/%d (%s)%s",
            rollout.model,
            rollout.canary_version,
            decision.action,
            rollout.step_index + 1,
            len(rollout.steps_bp),
            decision.reason,
            "" if applied or decision.action == GuardAction.HOLD else ", not applied",
        )
        return verdict


@dataclass
class RolloutServices:
    ledger: UsageLedger  # live traffic per version, for status and the guard
    guard: RolloutGuardTask


async def open_rollout_services(
    settings: Settings, registry: Registry, stack: AsyncExitStack, *, guard_tick_s: float = TICK_S
) -> RolloutServices:
    """The usage ledger (PostgreSQL down at start: it opens in the background, reads raise
    ``LedgerUnavailable`` until then) and the running guard, both closed by ``stack``."""
    ledger = await open_ledger(settings, keep_trying=True)
    stack.push_async_callback(ledger.close)
    guard = RolloutGuardTask(registry, ledger, tick_s=guard_tick_s)
    await guard.start()
    stack.push_async_callback(guard.close)
    return RolloutServices(ledger=ledger, guard=guard)
