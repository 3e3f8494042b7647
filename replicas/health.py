"""The control plane's replica health checks: a round starts every ``interval_s`` (start to start; a
round that overruns is followed at once) and checks each registered replica in ``starting``, ``ready``,
``failed`` or ``draining``. A check passes when both hold:

1. ``replicas.verify.verify_replica``: Triton reports the registry's version ready AND the model
   configuration it serves carries the registry's weights digest;
2. ``replicas.probe.probe_replica``: one real generation of one token at that version finishes
   within ``probe_timeout_s``. Readiness alone cannot see a wedged engine (Triton up, port open, no
   tokens); the probe does.

The verdict is recorded in the registry (``record_health``):

- fails: ``failed`` with the reason in words at once (one bad check: a wedge is caught by the first round
  after it, within two intervals while ``probe_timeout_s <= interval_s``), except a ``starting`` replica
  within ``start_grace_s`` of its registration (it is loading: it stays ``starting``, the reason recorded)
  and a ``draining`` one;
- passes: ``ready`` for a ``starting`` or ``ready`` replica; a ``failed`` one comes back only after
  ``num_good_checks_to_recover`` consecutive passing checks (2 by default: one lucky probe of a flapping
  replica does not send it work); until then it stays ``failed`` with ``passing again: n of K good
  checks``. A ``draining`` one stays draining;
- ``stopped`` replicas are not checked, nor those whose launch failed (``launch_failed``: the actuator
  stopped their process and recorded why; a check would only overwrite that reason with "connection
  refused", even one in flight when the launch failed).

The count of consecutive passes is this checker's own state (per replica, reset by a failing check or a
re-registration, not persisted: a restarted control plane asks a failed replica for K passes again); each
change of it on a failed replica is one log line.

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
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge

from replicas.probe import DEFAULT_PROBE_TIMEOUT_S, ProbeResult, probe_replica
from replicas.verify import Verification, verify_replica
from sluice.stores.registry.base import (
    NotFound,
    Registry,
    RegistryError,
    RegistryUnavailable,
    Replica,
    ReplicaState,
)

log = logging.getLogger("sluice.control_plane.health")

HEALTH_ACTOR = "control-plane/health"
DEFAULT_INTERVAL_S = 2.0
# A starting replica is loading its model: it may fail its check this long before it counts as failed.
# NOTE: longer than a local replica's launch timeout, so the actuator, not this, fails a slow launch.
DEFAULT_START_GRACE_S = 120.0
CHECK_TIMEOUT_S = 2.0
DEFAULT_NUM_GOOD_CHECKS_TO_RECOVER = 2
MAX_CONCURRENT_CHECKS = 16
CHECKED_STATES = frozenset(
    {ReplicaState.STARTING, ReplicaState.READY, ReplicaState.FAILED, ReplicaState.DRAINING}
)

Verify = Callable[[str, str, str, str, float], Awaitable[Verification]]
# (endpoint, model, version, timeout_s) -> the probe's result
Probe = Callable[[str, str, str, float], Awaitable[ProbeResult]]
# A decision on a replica as read under the lock: (new state, detail), or None to write nothing.
Decide = Callable[[Replica], tuple[ReplicaState, str] | None]


def next_state(
    current: ReplicaState,
    passed: bool,
    *,
    starting_for_s: float,
    start_grace_s: float,
    num_good_checks: int = 1,
    num_good_checks_to_recover: int = 1,
) -> ReplicaState:
    """The state a health check's verdict leaves a replica in (pure; see the module docstring).
    ``num_good_checks``: consecutive passing checks, this one included."""
    if current in (ReplicaState.DRAINING, ReplicaState.STOPPED):
        return current
    if passed:
        if current == ReplicaState.FAILED and num_good_checks < num_good_checks_to_recover:
            return ReplicaState.FAILED
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
        self.version_replicas = Gauge(
            "sluice_control_plane_version_replicas",
            "Registered replicas by model, version, pool and state, as of the health checks' last round "
            "(what the fleet costs: every state but stopped runs a machine)",
            ["model", "version", "pool", "state"],
            registry=registry,
        )
        self._version_labels: set[tuple[str, str, str, str]] = set()

    def count_states(self, replicas: list[Replica]) -> None:
        for state in ReplicaState:
            self.replicas.labels(str(state)).set(sum(1 for r in replicas if r.state == state))
        counts = collections.Counter((r.model, r.version, str(r.pool), str(r.state)) for r in replicas)
        for gone in self._version_labels - counts.keys():  # a version or state no replica is in now
            self.version_replicas.remove(*gone)
        for labels, num_replicas in counts.items():
            self.version_replicas.labels(*labels).set(num_replicas)
        self._version_labels = set(counts)


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
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        num_good_checks_to_recover: int = DEFAULT_NUM_GOOD_CHECKS_TO_RECOVER,
        verify: Verify = verify_replica,
        probe: Probe = probe_replica,
        launch_failed: Callable[[str], bool] = lambda _replica_id: False,
    ) -> None:
        if min(interval_s, check_timeout_s, probe_timeout_s) <= 0 or start_grace_s < 0:
            raise ValueError(
                "interval_s, check_timeout_s and probe_timeout_s must be positive, start_grace_s >= 0"
            )
        if num_good_checks_to_recover < 1:
            raise ValueError(f"num_good_checks_to_recover must be >= 1, got {num_good_checks_to_recover}")
        self._states = states
        self._registry = states.registry
        self._metrics = HealthMetrics(metrics_registry)
        self._interval_s = interval_s
        self._start_grace_s = start_grace_s
        self._check_timeout_s = check_timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._num_good_checks_to_recover = num_good_checks_to_recover
        self._verify = verify
        self._probe = probe
        self._launch_failed = launch_failed
        # replica_id -> (the registration checked: endpoint, model, version; consecutive passing checks)
        self._good_checks: dict[str, tuple[tuple[str, str, str], int]] = {}
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
        loop = asyncio.get_running_loop()
        round_started = loop.time()
        while True:
            # Sleep first: a restarting service leaves the recorded states alone for one interval.
            # NOTE: start to start, so a round slowed by a wedged replica's probe does not stretch the next
            # wait: a wedge is caught within two intervals.
            await asyncio.sleep(max(0.0, round_started + self._interval_s - loop.time()))
            round_started = loop.time()
            try:
                await self.check_round()
                if registry_down:
                    log.debug("replica health checks: the registry answers again")
                registry_down = False
            except (RegistryError, OSError) as exc:
                if not registry_down:  # once per outage, not once per round
                    # NOTE: the registry's store says its outage once each way (sluice.outages); any
                    # other failure to read it is this loop's to say
                    level = logging.DEBUG if isinstance(exc, RegistryUnavailable) else logging.WARNING
                    log.log(level, "replica health checks paused: the registry does not answer: %s", exc)
                registry_down = True
            except Exception:
                log.exception("replica health check round failed")  # a bug: keep checking the others

    async def check_round(self) -> None:
        """Check every replica in ``CHECKED_STATES`` once, concurrently."""
        snapshot = await self._registry.snapshot()
        self._metrics.count_states(list(snapshot.replicas))
        digests = {(v.model, v.version): v.weights_digest for v in snapshot.versions}
        due = [
            r
            for r in snapshot.replicas
            if r.state in CHECKED_STATES and not self._launch_failed(r.replica_id)
        ]
        due_ids = {r.replica_id for r in due}
        for gone in [replica_id for replica_id in self._good_checks if replica_id not in due_ids]:
            del self._good_checks[gone]
        await asyncio.gather(*(self._check(r, digests.get((r.model, r.version), "")) for r in due))

    async def check(self, replica: Replica) -> Replica | None:
        """Check one replica now and record the verdict; the replica as recorded (None: removed)."""
        version = await self._registry.get_version(replica.model, replica.version)
        return await self._check(replica, version.weights_digest)

    async def _verdict(self, replica: Replica, digest: str) -> Verification:
        """Verified, then probed (a replica that fails verification is not sent a generation)."""
        async with self._limit:
            verified = await self._verify(
                replica.endpoint, replica.model, replica.version, digest, self._check_timeout_s
            )
            if not verified.ok:
                return verified
            probed = await self._probe(
                replica.endpoint, replica.model, replica.version, self._probe_timeout_s
            )
        return Verification(probed.ok, probed.detail)

    def _count_good_check(self, replica: Replica, passed: bool) -> tuple[int, int]:
        """Record one check's verdict; (consecutive passes before it, consecutive passes now)."""
        registration = (replica.endpoint, replica.model, replica.version)
        known, before = self._good_checks.get(replica.replica_id, (registration, 0))
        if known != registration:
            before = 0  # re-registered: its history is another replica's
        now = before + 1 if passed else 0
        self._good_checks[replica.replica_id] = (registration, now)
        return before, now

    async def _check(self, replica: Replica, digest: str) -> Replica | None:
        result = await self._verdict(replica, digest)
        self._metrics.checks.labels("pass" if result.ok else "fail").inc()
        num_before, num_good = self._count_good_check(replica, result.ok)
        needed = self._num_good_checks_to_recover

        def decide(current: Replica) -> tuple[ReplicaState, str] | None:
            if (current.endpoint, current.model, current.version) != (
                replica.endpoint,
                replica.model,
                replica.version,
            ) or current.state not in CHECKED_STATES:
                return None  # re-registered or stopped while this check ran: the next round sees it
            if self._launch_failed(current.replica_id):
                return None  # its launch failed while this check ran: the launch's reason stands
            starting_for_s = (datetime.now(UTC) - current.updated_at).total_seconds()
            state = next_state(
                current.state, result.ok, starting_for_s=starting_for_s, start_grace_s=self._start_grace_s,
                num_good_checks=num_good, num_good_checks_to_recover=needed,
            )  # fmt: skip
            if state == ReplicaState.FAILED and result.ok:
                return state, f"passing again: {num_good} of {needed} good checks before it is ready"
            return state, result.detail

        changed = await self._states.update(replica.replica_id, decide, actor=HEALTH_ACTOR)
        if changed is None:
            return None
        before, after = changed
        if before.state == after.state == ReplicaState.FAILED and num_before != num_good:
            log.info(
                "replica %s: %d of %d consecutive good checks before it is ready",
                after.replica_id, num_good, needed,
            )  # fmt: skip
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
