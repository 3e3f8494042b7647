"""The control plane's replica health checks against a real tritonserver (the session's ``replica``) and a
real registry (SQLite and PostgreSQL): a replica is marked ready only once Triton reports its version
ready, serves the registry's digest and answers a real inference probe; failed with the reason when not,
and back to ready after two consecutive passing checks; a wedged engine (Triton ready, no token) is
failed within two intervals; a replica serving other weights never becomes ready; a draining replica
stays draining. Each state change is one log line and a metric."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry
from tcp_proxy import ProxyThread
from wedge import wedged_engine

from replicas.health import HealthChecker, ReplicaStates, next_state
from replicas.launcher import TritonServer
from replicas.probe import ProbeResult
from replicas.verify import Verification
from sluice.stores.registry.base import Registry, ReplicaState
from sluice.stores.registry.postgres import PostgresRegistry
from sluice.stores.registry.sqlite import SqliteRegistry
from sluice.weights_digest import weights_digest

T = TypeVar("T")
Aio = Callable[[Coroutine[Any, Any, T]], T]

MODEL = "sluice-tiny"
WRONG_DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("current", "passed", "starting_for_s", "expected"),
    [
        (ReplicaState.STARTING, True, 0.0, ReplicaState.READY),
        (ReplicaState.STARTING, False, 5.0, ReplicaState.STARTING),  # loading, within the grace
        (ReplicaState.STARTING, False, 11.0, ReplicaState.FAILED),  # past it
        (ReplicaState.READY, True, 99.0, ReplicaState.READY),
        (ReplicaState.READY, False, 0.0, ReplicaState.FAILED),
        (ReplicaState.FAILED, True, 0.0, ReplicaState.READY),  # it comes back
        (ReplicaState.FAILED, False, 0.0, ReplicaState.FAILED),
        (ReplicaState.DRAINING, True, 0.0, ReplicaState.DRAINING),
        (ReplicaState.DRAINING, False, 0.0, ReplicaState.DRAINING),
        (ReplicaState.STOPPED, True, 0.0, ReplicaState.STOPPED),
    ],
)
def test_next_state(
    current: ReplicaState, passed: bool, starting_for_s: float, expected: ReplicaState
) -> None:
    assert next_state(current, passed, starting_for_s=starting_for_s, start_grace_s=10.0) == expected


@pytest.mark.parametrize(
    ("current", "num_good_checks", "expected"),
    [
        (ReplicaState.FAILED, 1, ReplicaState.FAILED),  # one good check is not enough to come back
        (ReplicaState.FAILED, 2, ReplicaState.READY),
        (ReplicaState.FAILED, 5, ReplicaState.READY),
        (ReplicaState.STARTING, 1, ReplicaState.READY),  # a new replica is not a recovering one
        (ReplicaState.READY, 1, ReplicaState.READY),
        (ReplicaState.DRAINING, 3, ReplicaState.DRAINING),
    ],
)
def test_a_failed_replica_comes_back_after_k_consecutive_good_checks(
    current: ReplicaState, num_good_checks: int, expected: ReplicaState
) -> None:
    state = next_state(
        current, True, starting_for_s=0.0, start_grace_s=10.0, num_good_checks=num_good_checks,
        num_good_checks_to_recover=2,
    )  # fmt: skip
    assert state == expected


@pytest.fixture(params=["sqlite", "postgres"])
def registry(request: pytest.FixtureRequest, tmp_path: Path, aio: Aio[Any]) -> Iterator[Registry]:
    """A fresh registry, on each backend (PostgreSQL: a schema of the run's database)."""
    registry: Registry
    if request.param == "sqlite":
        registry = SqliteRegistry(tmp_path / "sluice.db")
    else:
        registry = PostgresRegistry(request.getfixturevalue("pg_schema_url"), pool_max_size=3)
    aio(registry.open())
    aio(registry.create_model(MODEL, actor="test"))
    yield registry
    aio(registry.close())


def add_version(aio: Aio[Any], registry: Registry, version: str, digest: str, checkpoint: Path) -> None:
    aio(registry.add_version(
        MODEL, version, artifact_uri=checkpoint.as_uri(), weights_digest=digest, build_config={}, actor="test"
    ))  # fmt: skip


def checker(registry: Registry, metrics: CollectorRegistry, start_grace_s: float = 0.0) -> HealthChecker:
    return HealthChecker(ReplicaStates(registry), metrics, start_grace_s=start_grace_s)


def state_changes(metrics: CollectorRegistry, state: str) -> float:
    value = metrics.get_sample_value("sluice_control_plane_replica_state_changes_total", {"state": state})
    return value or 0.0


def test_a_replica_is_ready_once_verified_failed_when_unreachable_and_back_when_it_answers(
    registry: Registry,
    replica: TritonServer,
    dev_checkpoint: Path,
    aio: Aio[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    add_version(aio, registry, "1", weights_digest(dev_checkpoint), dev_checkpoint)
    host, port = replica.grpc_url.rsplit(":", 1)
    proxy = ProxyThread(host, int(port))  # a network between the control plane and the replica
    metrics = CollectorRegistry()
    health = checker(registry, metrics)
    caplog.set_level(logging.INFO, logger="sluice.control_plane.health")
    try:
        aio(registry.register_replica(
            "r-1", endpoint=f"127.0.0.1:{proxy.port}", model=MODEL, version="1", actor="test"
        ))  # fmt: skip
        aio(health.check_round())
        ready = aio(registry.get_replica("r-1"))
        assert ready.state == ReplicaState.READY and ready.health_detail == ""
        assert ready.last_health_at is not None

        proxy.cut()
        aio(health.check_round())
        failed = aio(registry.get_replica("r-1"))
        assert failed.state == ReplicaState.FAILED
        assert f"127.0.0.1:{proxy.port}" in failed.health_detail  # the reason, in words

        generation = aio(registry.generation())
        aio(health.check_round())  # failing again: a heartbeat, not a change
        assert aio(registry.generation()) == generation

        proxy.restore()
        deadline = time.monotonic() + 10  # gRPC may wait out a short reconnect backoff: a few rounds
        num_rounds_passing = 0
        while aio(registry.get_replica("r-1")).state != ReplicaState.READY:
            assert time.monotonic() < deadline, aio(registry.get_replica("r-1")).health_detail
            time.sleep(0.2)
            aio(health.check_round())
            num_rounds_passing += "passing again" in aio(registry.get_replica("r-1")).health_detail
        assert num_rounds_passing == 1  # the first good check left it failed: two are needed
    finally:
        proxy.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.control_plane.health"]
    changes = [line for line in lines if " -> " in line]
    assert len(changes) == 3, lines  # one line per state change, none for the repeated failure
    assert "replica r-1: 1 of 2 consecutive good checks before it is ready" in lines
    assert "replica r-1 (sluice-tiny version 1" in changes[0] and "starting -> ready" in changes[0]
    assert "ready -> failed: " in changes[1] and "failed -> ready" in changes[2]
    assert state_changes(metrics, "ready") == 2 and state_changes(metrics, "failed") == 1
    assert metrics.get_sample_value("sluice_control_plane_replicas", {"state": "ready"}) is not None


def test_a_replica_serving_other_weights_is_failed_and_never_ready(
    registry: Registry, replica: TritonServer, dev_checkpoint: Path, aio: Aio[Any]
) -> None:
    add_version(aio, registry, "1", WRONG_DIGEST, dev_checkpoint)  # the registry says other weights
    health = checker(registry, CollectorRegistry())
    for registered_as in (ReplicaState.STARTING, ReplicaState.READY):
        aio(registry.register_replica(
            "r-wrong", endpoint=replica.grpc_url, model=MODEL, version="1", actor="test", state=registered_as
        ))  # fmt: skip
        for _ in range(3):
            aio(health.check_round())
            found = aio(registry.get_replica("r-wrong"))
            assert found.state == ReplicaState.FAILED
            assert (
                WRONG_DIGEST in found.health_detail and weights_digest(dev_checkpoint) in found.health_detail
            )
    audit = aio(registry.audit(model=MODEL))
    assert not [e for e in audit if e.after and isinstance(e.after, dict) and e.after.get("state") == "ready"
                and e.action == "replica.state"]  # fmt: skip


def test_a_starting_replica_within_its_grace_stays_starting_with_the_reason(
    registry: Registry, replica: TritonServer, dev_checkpoint: Path, aio: Aio[Any]
) -> None:
    add_version(aio, registry, "1", weights_digest(dev_checkpoint), dev_checkpoint)
    add_version(aio, registry, "2", weights_digest(dev_checkpoint), dev_checkpoint)  # Triton has no 2
    health = checker(registry, CollectorRegistry(), start_grace_s=600.0)
    aio(registry.register_replica("r-2", endpoint=replica.grpc_url, model=MODEL, version="2", actor="test"))
    aio(health.check_round())
    found = aio(registry.get_replica("r-2"))
    assert found.state == ReplicaState.STARTING
    assert "version 2" in found.health_detail and found.last_health_at is not None


def test_a_draining_replica_is_checked_but_stays_draining(
    registry: Registry, replica: TritonServer, dev_checkpoint: Path, aio: Aio[Any]
) -> None:
    add_version(aio, registry, "1", WRONG_DIGEST, dev_checkpoint)
    health = checker(registry, CollectorRegistry())
    aio(registry.register_replica(
        "r-d", endpoint=replica.grpc_url, model=MODEL, version="1", actor="test", state=ReplicaState.DRAINING
    ))  # fmt: skip
    aio(health.check_round())
    found = aio(registry.get_replica("r-d"))
    assert found.state == ReplicaState.DRAINING and WRONG_DIGEST in found.health_detail


def test_stopped_replicas_are_not_checked(registry: Registry, dev_checkpoint: Path, aio: Aio[Any]) -> None:
    add_version(aio, registry, "1", WRONG_DIGEST, dev_checkpoint)
    calls: list[str] = []

    async def verify(endpoint: str, *_: object) -> Any:
        calls.append(endpoint)
        raise AssertionError("a stopped replica must not be checked")

    async def probe(endpoint: str, *_: object) -> Any:
        raise AssertionError("a stopped replica must not be probed")

    health = HealthChecker(ReplicaStates(registry), CollectorRegistry(), verify=verify, probe=probe)
    aio(registry.register_replica(
        "r-s", endpoint="127.0.0.1:1", model=MODEL, version="1", actor="test", state=ReplicaState.STOPPED
    ))  # fmt: skip
    aio(health.check_round())
    assert calls == [] and aio(registry.get_replica("r-s")).state == ReplicaState.STOPPED


def test_a_check_in_flight_never_undoes_a_drain(
    registry: Registry, dev_checkpoint: Path, aio: Aio[Any]
) -> None:
    """The verdict is applied to the replica's state as read when it is recorded, not when the check began."""
    add_version(aio, registry, "1", weights_digest(dev_checkpoint), dev_checkpoint)
    states = ReplicaStates(registry)

    async def run() -> ReplicaState:
        checking, drained = asyncio.Event(), asyncio.Event()

        async def verify(*_: object) -> Verification:  # a named fake: it passes once the drain is written
            checking.set()
            await drained.wait()
            return Verification(True, "")

        async def probe(*_: object) -> ProbeResult:
            return ProbeResult(True, "", 0.01)

        health = HealthChecker(states, CollectorRegistry(), verify=verify, probe=probe)
        await registry.register_replica(
            "r-1", endpoint="127.0.0.1:1", model=MODEL, version="1", actor="test", state=ReplicaState.READY
        )
        round_ = asyncio.create_task(health.check_round())
        await checking.wait()
        await states.update("r-1", lambda _: (ReplicaState.DRAINING, "drained"), actor="test")
        drained.set()
        await round_
        return (await registry.get_replica("r-1")).state

    assert aio(run()) == ReplicaState.DRAINING


def test_a_failed_launch_keeps_its_reason(registry: Registry, dev_checkpoint: Path, aio: Aio[Any]) -> None:
    """A check in flight when the actuator records a failed launch writes nothing, and later rounds leave
    the replica alone: its reason stays the launch's, not the "connection refused" of a stopped process."""
    add_version(aio, registry, "1", weights_digest(dev_checkpoint), dev_checkpoint)
    states = ReplicaStates(registry)
    launch_failed: set[str] = set()
    checked: list[str] = []

    async def run() -> tuple[ReplicaState, str]:
        checking, failed = asyncio.Event(), asyncio.Event()

        async def verify(endpoint: str, *_: object) -> Verification:  # a named fake: fails after the launch
            checked.append(endpoint)
            checking.set()
            await failed.wait()
            return Verification(False, "connection refused")

        async def probe(*_: object) -> ProbeResult:
            raise AssertionError("a replica failing verification is not probed")

        health = HealthChecker(
            states, CollectorRegistry(), verify=verify, probe=probe, launch_failed=launch_failed.__contains__
        )
        await registry.register_replica(
            "r-l", endpoint="127.0.0.1:1", model=MODEL, version="1", actor="test", state=ReplicaState.STARTING
        )
        round_ = asyncio.create_task(health.check_round())
        await checking.wait()
        launch_failed.add("r-l")  # what the actuator does: mark the launch failed, then record why
        await states.update("r-l", lambda _: (ReplicaState.FAILED, "other weights than the version's"),
                            actor="control-plane/local-replicas")  # fmt: skip
        failed.set()
        await round_
        await health.check_round()  # not checked again
        found = await registry.get_replica("r-l")
        return found.state, found.health_detail

    assert aio(run()) == (ReplicaState.FAILED, "other weights than the version's")
    assert checked == ["127.0.0.1:1"]


def test_a_replica_that_fails_verification_is_not_probed(registry: Registry, aio: Aio[Any]) -> None:
    add_version(aio, registry, "1", WRONG_DIGEST, Path("/nonexistent"))
    probed: list[str] = []

    async def verify(*_: object) -> Verification:
        return Verification(False, "model sluice-tiny version 1 is not ready")

    async def probe(endpoint: str, *_: object) -> ProbeResult:
        probed.append(endpoint)
        return ProbeResult(True, "", 0.01)

    health = HealthChecker(ReplicaStates(registry), CollectorRegistry(), verify=verify, probe=probe)
    aio(registry.register_replica(
        "r-n", endpoint="127.0.0.1:1", model=MODEL, version="1", actor="test", state=ReplicaState.READY
    ))  # fmt: skip
    aio(health.check_round())
    found = aio(registry.get_replica("r-n"))
    assert probed == [] and found.state == ReplicaState.FAILED and "is not ready" in found.health_detail


@pytest.fixture(scope="module")
def wedge_replica(start_replica: Callable[[str], TritonServer]) -> TritonServer:
    """A replica of its own: its engine gets frozen, the session's replica must not be."""
    return start_replica("health_wedge")


INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 0.5


def test_a_wedged_engine_is_failed_within_two_intervals_and_back_after_two_good_probes(
    registry: Registry,
    wedge_replica: TritonServer,
    dev_checkpoint: Path,
    aio: Aio[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The checker's own loop, on a real tritonserver whose engine threads are frozen: Triton stays up and
    reports the model ready, so only the probe can tell."""
    add_version(aio, registry, "1", weights_digest(dev_checkpoint), dev_checkpoint)
    caplog.set_level(logging.INFO, logger="sluice.control_plane.health")
    health = HealthChecker(
        ReplicaStates(registry), CollectorRegistry(), interval_s=INTERVAL_S, probe_timeout_s=PROBE_TIMEOUT_S
    )

    async def wait_for(state: ReplicaState, within_s: float) -> float:
        started = time.monotonic()
        while (found := await registry.get_replica("r-w")).state != state:
            assert time.monotonic() - started < within_s, (state, found.state, found.health_detail)
            await asyncio.sleep(0.02)
        return time.monotonic() - started

    async def run() -> tuple[float, float, str]:
        await registry.register_replica(
            "r-w", endpoint=wedge_replica.grpc_url, model=MODEL, version="1", actor="test"
        )
        await health.start()
        try:
            await wait_for(ReplicaState.READY, within_s=3 * INTERVAL_S)
            with wedged_engine(wedge_replica.config.effective_shm_prefix):
                caught_after_s = await wait_for(ReplicaState.FAILED, within_s=2 * INTERVAL_S)
                detail = (await registry.get_replica("r-w")).health_detail
                await asyncio.sleep(2 * INTERVAL_S)  # still wedged: it stays failed
                assert (await registry.get_replica("r-w")).state == ReplicaState.FAILED
            back_after_s = await wait_for(ReplicaState.READY, within_s=4 * INTERVAL_S)
            return caught_after_s, back_after_s, detail
        finally:
            await health.close()

    caught_after_s, back_after_s, detail = aio(run())
    assert caught_after_s <= 2 * INTERVAL_S and detail == f"wedged: no token within {PROBE_TIMEOUT_S:.1f} s"
    # two good rounds, one interval apart (the first may be a probe sent just before the thaw)
    assert back_after_s > INTERVAL_S - PROBE_TIMEOUT_S
    lines = [r.getMessage() for r in caplog.records if r.name == "sluice.control_plane.health"]
    recovery = lines[lines.index(next(line for line in lines if "ready -> failed" in line)) :]
    assert "replica r-w: 1 of 2 consecutive good checks before it is ready" in recovery
    assert "failed -> ready" in recovery[-1]
