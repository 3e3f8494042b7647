"""The control plane's replica health checks: every ``interval_s`` each registered replica in
``starting``, ``ready``, ``failed`` or ``draining`` is verified (``sluice.triton.verify.verify_replica``:
Triton reports the registry's version ready AND the model configuration it serves carries the registry's
weights digest), and the verdict is recorded in the registry (``record_health``):

- passes: ``ready`` (a ``starting`` or ``failed`` replica comes back; a ``draining`` one stays draining);
- fails: ``failed`` with the reason in words, except a ``starting`` replica within ``start_grace_s`` of its
  registration (it is loading: it stays ``starting``, the reason recorded) and a ``draining`` one;
- ``stopped`` replicas are not checked.

A replica whose digest differs therefore never becomes ``ready``, and gateways route only ``ready`` ones.
Each state change is one log line and a count of ``sluice_control_plane_replica_state_changes_total``;
``sluice_control_plane_replicas`` gives how many replicas are in each state (as of the last round) and
``sluice_control_plane_replica_checks_total`` counts checks by result.

Every replica-state write of this service (health reports, the actuator's drains, registrations and
removals) goes through one ``ReplicaStates``: one at a time, each decided from the replica's state as read
under its lock, so a health report never undoes a drain made while its check was in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge

from sluice.registry.base import NotFound, Registry, RegistryError, Replica, ReplicaState
from sluice.triton.verify import Verification, verify_replica

log = logging.getLogger("sluice.control_plane.health")

HEALTH_ACTOR = "control-plane/health"
DEFAULT_INTERVAL_S = 2.0
# A starting replica is loading its model: it may fail its check this long before it counts as failed.
# NOTE: longer than a local replica's launch timeout, so the actuator, not this, fails a slow launch.
DEFAULT_START_GRACE_S = 120.0
CHECK_TIMEOUT_S = 2.0
MAX_CONCURRENT_CHECKS = 16
CHECKED_STATES = frozenset(
    {ReplicaState.STARTING, ReplicaState.READY, ReplicaState.FAILED, ReplicaState.DRAINING}
)

Verify = Callable[[str, str, str, str, float], Awaitable[Verification]]
# A decision on a replica as read under the lock: (new state, detail), or None to write nothing.
Decide = Callable[[Replica], tuple[ReplicaState, str] | None]


def next_state(
    current: ReplicaState, passed: bool, *, starting_for_s: float, start_grace_s: float
) -> ReplicaState:
    """The state a health check's verdict leaves a replica in (pure; see the module docstring)."""
    if current in (ReplicaState.DRAINING, ReplicaState.STOPPED):
        return current
    if passed:
        return ReplicaState.READY
    if current == ReplicaState.STARTING and starting_for_s < start_grace_s:
        return ReplicaState.STARTING
    return ReplicaState.FAILED


class ReplicaStates:
    """The one writer of replica rows in this service (see the module docstring)."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._lock = asyncio.Lock()

    async def update(self, replica_id: str, decide: Decide, *, actor: str) -> tuple[Replica, Replica] | None:
        """Read the replica, ``decide``, record the decision; (before, after), or None when it is not
        registered. ``decide`` may raise to refuse: nothing is written then."""
        async with self._lock:
            try:
                before = await self.registry.get_replica(replica_id)
            except NotFound:
                return None
            decision = decide(before)
            if decision is None:
                return before, before
            state, detail = decision
            after = await self.registry.record_health(replica_id, state, actor=actor, detail=detail[:2000])
            return before, after

    async def register(
        self,
        replica_id: str,
        *,
        endpoint: str,
        model: str,
        version: str,
        actor: str,
        state: ReplicaState,
        detail: str,
        metrics_url: str = "",
    ) -> Replica:
        async with self._lock:
            return await self.registry.register_replica(
                replica_id, endpoint=endpoint, model=model, version=version, actor=actor, state=state,
                detail=detail, metrics_url=metrics_url,
            )  # fmt: skip

    async def remove(self, replica_id: str, *, actor: str) -> bool:
        """Remove it from the registry; False when it was not there."""
        async with self._lock:
            try:
                await self.registry.remove_replica(replica_id, actor=actor)
            except NotFound:
                return False
            return True


class HealthMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.state_changes = Counter(
            "sluice_control_plane_replica_state_changes",
            "Replica state changes the health checks made, by the state entered",
            ["state"],
            registry=registry,
        )
        self.checks = Counter(
            "sluice_control_plane_replica_checks",
            "Replica health checks, by result (pass, fail)",
            ["result"],
            registry=registry,
        )
        self.replicas = Gauge(
            "sluice_control_plane_replicas",
            "Registered replicas by state, as of the health checks' last round",
            ["state"],
            registry=registry,
        )

    def count_states(self, replicas: list[Replica]) -> None:
        for state in ReplicaState:
            self.replicas.labels(str(state)).set(sum(1 for r in replicas if r.state == state))


class HealthChecker:
    """A background task of the service: ``start()`` runs a round every ``interval_s`` until ``close()``.
    ``check_round()`` and ``check(replica)`` run one round or one replica now (registration, tests)."""

    def __init__(
        self,
        states: ReplicaStates,
        metrics_registry: CollectorRegistry,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        start_grace_s: float = DEFAULT_START_GRACE_S,
        check_timeout_s: float = CHECK_TIMEOUT_S,
        verify: Verify = verify_replica,
    ) -> None:
        if interval_s <= 0 or start_grace_s < 0 or check_timeout_s <= 0:
            raise ValueError("interval_s and check_timeout_s must be positive, start_grace_s >= 0")
        self._states = states
        self._registry = states.registry
        self._metrics = HealthMetrics(metrics_registry)
        self._interval_s = interval_s
        self._start_grace_s = start_grace_s
        self._check_timeout_s = check_timeout_s
        self._verify = verify
        self._limit = asyncio.Semaphore(MAX_CONCURRENT_CHECKS)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="replica-health-checks")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        registry_down = False
        while True:
            # Sleep first: a restarting service leaves the recorded states alone for one interval.
            await asyncio.sleep(self._interval_s)
            try:
                await self.check_round()
                if registry_down:
                    log.info("replica health checks: the registry answers again")
                registry_down = False
            except (RegistryError, OSError) as exc:
                if not registry_down:  # once per outage, not once per round
                    log.warning("replica health checks paused: the registry does not answer: %s", exc)
                registry_down = True
            except Exception:
                log.exception("replica health check round failed")  # a bug: keep checking the others

    async def check_round(self) -> None:
        """Check every replica in ``CHECKED_STATES`` once, concurrently."""
        snapshot = await self._registry.snapshot()
        self._metrics.count_states(list(snapshot.replicas))
        digests = {(v.model, v.version): v.weights_digest for v in snapshot.versions}
        due = [r for r in snapshot.replicas if r.state in CHECKED_STATES]
        await asyncio.gather(*(self._check(r, digests.get((r.model, r.version), "")) for r in due))

    async def check(self, replica: Replica) -> Replica | None:
        """Check one replica now and record the verdict; the replica as recorded (None: removed)."""
        version = await self._registry.get_version(replica.model, replica.version)
        return await self._check(replica, version.weights_digest)

    async def _check(self, replica: Replica, digest: str) -> Replica | None:
        async with self._limit:
            result = await self._verify(
                replica.endpoint, replica.model, replica.version, digest, self._check_timeout_s
            )
        self._metrics.checks.labels("pass" if result.ok else "fail").inc()

        def decide(current: Replica) -> tuple[ReplicaState, str] | None:
            if (current.endpoint, current.model, current.version) != (
                replica.endpoint,
                replica.model,
                replica.version,
            ) or current.state not in CHECKED_STATES:
                return None  # re-registered or stopped while this check ran: the next round sees it
            starting_for_s = (datetime.now(UTC) - current.updated_at).total_seconds()
            state = next_state(
                current.state, result.ok, starting_for_s=starting_for_s, start_grace_s=self._start_grace_s
            )
            return state, result.detail

        changed = await self._states.update(replica.replica_id, decide, actor=HEALTH_ACTOR)
        if changed is None:
            return None
        before, after = changed
        if before.state != after.state:
            self._metrics.state_changes.labels(str(after.state)).inc()
            level = logging.WARNING if after.state == ReplicaState.FAILED else logging.INFO
            reason = f": {after.health_detail}" if after.health_detail else ""
            log.log(
                level,
                "replica %s (%s version %s at %s): %s -> %s%s",
                after.replica_id,
                after.model,
                after.version,
                after.endpoint,
                before.state,
                after.state,
                reason,
            )
        return after
