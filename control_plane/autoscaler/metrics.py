"""The autoscaler's metrics, on the control plane's ``/metrics`` (its ``ControlPlaneMetrics.registry``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from sluice.policy.autoscale import Decision


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["model", "version"]
        self.desired = Gauge(
            "sluice_control_plane_autoscaler_desired_replicas",
            "Routed replicas the autoscaler wants for the version (ready + starting, warm pool not counted)",
            labels,
            registry=registry,
        )
        self.warm_pool = Gauge(
            "sluice_control_plane_autoscaler_warm_pool_replicas",
            "Replicas of the version in the warm pool (loaded, unrouted; starting ones included)",
            labels,
            registry=registry,
        )
        self.pressure = Gauge(
            "sluice_control_plane_autoscaler_pressure",
            "The largest of TTFT p95 / SLO, queue wait p95 / target, queue depth / target (1 = at target)",
            labels,
            registry=registry,
        )
        self.decisions = Counter(
            "sluice_control_plane_autoscaler_decisions",
            "Autoscaler decisions by version, direction (up, down, hold) and reason",
            [*labels, "direction", "reason"],
            registry=registry,
        )
        self.action_failures = Counter(
            "sluice_control_plane_autoscaler_action_failures",
            "Actions (start, retire, pool moves) that failed; the decision is taken again next round",
            [*labels, "action"],
            registry=registry,
        )

    def observe(self, model: str, version: str, decision: Decision, num_warm: int, pressure: float) -> None:
        self.desired.labels(model, version).set(decision.desired_replicas)
        self.warm_pool.labels(model, version).set(num_warm)
        self.pressure.labels(model, version).set(pressure)
        self.decisions.labels(model, version, decision.direction.value, decision.reason_code.value).inc()
