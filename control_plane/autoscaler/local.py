"""The local actuator: tritonserver processes on this machine, through the control plane's own
``LocalReplicas`` (what ``sluice replicas start/stop`` drive). A start registers the replicas ``starting``
in the pool asked for; a retirement is ``LocalReplicas.stop``: drain (registry ``draining``), wait until
the replica's Triton metrics show no request or the drain bound, then stop the process and remove it."""

from __future__ import annotations

import logging

from control_plane.autoscaler.actuator import Actuator
from replicas.local_replicas import MAX_REPLICAS_PER_START, LocalReplicas, ReplicaConflict
from sluice.stores.registry.base import NotFound, Replica, ReplicaPool

log = logging.getLogger("sluice.control_plane.autoscaler")

ACTOR = "control-plane/autoscaler"


class LocalActuator(Actuator):
    name = "local"

    def __init__(self, local: LocalReplicas, *, drain_timeout_s: float) -> None:
        self._local = local
        self._drain_timeout_s = drain_timeout_s

    async def start(self, model: str, version: str, count: int, *, pool: ReplicaPool) -> list[str]:
        started: list[str] = []
        while len(started) < count:  # LocalReplicas starts at most MAX_REPLICAS_PER_START at a time
            num = min(count - len(started), MAX_REPLICAS_PER_START)
            replicas = await self._local.start(model, version, num, None, actor=ACTOR, pool=pool)
            started += [r.replica_id for r in replicas]
        return started

    async def retire(self, replica: Replica) -> None:
        try:
            await self._local.stop(
                replica.replica_id, actor=ACTOR, timeout_s=self._drain_timeout_s, wait=False
            )
        except (ReplicaConflict, NotFound) as exc:  # not ours, or gone meanwhile: nothing to stop
            log.warning("autoscaler: replica %s not retired: %s", replica.replica_id, exc)

    async def close(self) -> None:
        """Nothing of its own: ``LocalReplicas`` finishes its stops and closes with the service."""
