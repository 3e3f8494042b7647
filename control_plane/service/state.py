"""What every handler shares: settings, the admin token store, the model registry, the metrics, the
replica services (health checks, local actuator) and the autoscaler when it runs. Built once in
``control_plane.service.app``; handlers reach it as ``app.state.cp`` (``state_of``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection

from control_plane.autoscaler.loop import Autoscaler
from control_plane.service.metrics import ControlPlaneMetrics
from control_plane.service.rollout_guard import RolloutServices
from replicas.health import HealthChecker, ReplicaStates
from replicas.local_replicas import LocalReplicas
from sluice.settings import Settings
from sluice.stores.admin_tokens.base import AdminTokenStore
from sluice.stores.registry.base import Registry


@dataclass
class ReplicaServices:
    states: ReplicaStates  # the one writer of replica rows
    health: HealthChecker
    local: LocalReplicas


@dataclass
class ControlPlaneState:
    settings: Settings
    tokens: AdminTokenStore
    registry: Registry
    metrics: ControlPlaneMetrics
    replicas: ReplicaServices
    rollouts: RolloutServices  # the usage ledger and the rollout guard
    autoscaler: Autoscaler | None = None  # running when SLUICE_AUTOSCALER=on


def state_of(connection: ASGIConnection[Any, Any, Any, Any]) -> ControlPlaneState:
    cp: ControlPlaneState = connection.app.state.cp
    return cp
