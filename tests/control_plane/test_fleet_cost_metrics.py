"""What cost per million output tokens is computed from on the control plane's side (issue 15): the
replica count by model, version, pool and state after each health round, and the configured replica-hour
price, exported only when configured."""

from __future__ import annotations

from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from control_plane.service.metrics import ControlPlaneMetrics
from replicas.health import HealthMetrics
from sluice.stores.registry.base import Replica, ReplicaPool, ReplicaState

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _replica(
    replica_id: str, version: str, state: ReplicaState, pool: ReplicaPool = ReplicaPool.GENERAL
) -> Replica:
    return Replica(replica_id, f"{replica_id}:8001", "m", version, state, "", None, NOW, NOW, pool=pool)


def test_replicas_are_counted_by_version_pool_and_state_and_a_state_left_reads_nothing() -> None:
    registry = CollectorRegistry()
    metrics = HealthMetrics(registry)

    def count(version: str, state: str, pool: str = "general") -> float | None:
        labels = {"model": "m", "version": version, "pool": pool, "state": state}
        return registry.get_sample_value("sluice_control_plane_version_replicas", labels)

    metrics.count_states([
        _replica("a", "1", ReplicaState.READY),
        _replica("b", "1", ReplicaState.READY),
        _replica("c", "1", ReplicaState.READY, ReplicaPool.WARM),
        _replica("d", "2", ReplicaState.FAILED),
    ])  # fmt: skip
    assert (count("1", "ready"), count("1", "ready", "warm"), count("2", "failed")) == (2, 1, 1)
    # The failed replica recovered and one of version 1 was stopped: the old series go, not freeze.
    metrics.count_states([
        _replica("a", "1", ReplicaState.READY),
        _replica("b", "1", ReplicaState.STOPPED),
        _replica("d", "2", ReplicaState.READY),
    ])  # fmt: skip
    assert (count("1", "ready"), count("1", "stopped"), count("2", "ready")) == (1, 1, 1)
    assert count("2", "failed") is None and count("1", "ready", "warm") is None


def test_the_replica_hour_price_is_exported_only_when_configured() -> None:
    price = "sluice_control_plane_replica_hour_price_usd"
    assert ControlPlaneMetrics().registry.get_sample_value(price) is None
    assert ControlPlaneMetrics(2.5).registry.get_sample_value(price) == 2.5
