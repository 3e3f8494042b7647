"""The Kubernetes actuator: one Deployment per model version (its name from a template, e.g.
``sluice-{model}-{version}``), scaled through the apps/v1 ``deployments/{name}/scale`` subresource with the
official ``kubernetes`` client (its calls are blocking: each runs in a thread).

The pods register themselves in the registry (``PUT /admin/v1/replicas/{pod name}``: a replica's id IS its
pod's name, the convention this actuator relies on), so ``start`` only raises the Deployment's replica
count and returns no ids; the loop moves new replicas into the warm pool when it asked for warm ones.

Scale-down never lets the Deployment pick a busy pod: ``retire`` drains the replica in the registry
(gateways send it nothing new), waits until its metrics show no request (or the drain bound), then marks
its pod ``controller.kubernetes.io/pod-deletion-cost: -1000`` (the ReplicaSet removes the cheapest pod
first), lowers the count by one, and removes the replica from the registry. If the pod cannot be marked,
the count is not lowered (that would kill another pod's requests): the replica stays draining, logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time

import httpx
from kubernetes import client as kube
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from control_plane.autoscaler.actuator import Actuator
from replicas.health import ReplicaStates
from replicas.local_replica import GATEWAY_PROPAGATION_S
from sluice.stores.registry.base import RegistryError, Replica, ReplicaPool, ReplicaState
from sluice.triton.metrics import replica_stats_from_metrics

log = logging.getLogger("sluice.control_plane.autoscaler")

ACTOR = "control-plane/autoscaler"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
IDLE_POLL_S = 1.0


class KubeError(Exception):
    """The API server refused or could not be reached; the message says which Deployment and why."""


def deployment_name(template: str, model: str, version: str) -> str:
    """The template filled in and made a DNS-1123 name (lower case, [a-z0-9-], at most 63 characters)."""
    name = re.sub(r"[^a-z0-9-]+", "-", template.format(model=model, version=version).lower())
    return name.strip("-")[:63].rstrip("-")


class KubeActuator(Actuator):
    name = "kubernetes"

    def __init__(
        self,
        api: kube.ApiClient,
        states: ReplicaStates,
        *,
        namespace: str,
        deployment_template: str,
        drain_timeout_s: float,
        idle_poll_s: float = IDLE_POLL_S,
    ) -> None:
        self._apps = kube.AppsV1Api(api)
        self._core = kube.CoreV1Api(api)
        self._states = states
        self._namespace = namespace
        self._template = deployment_template
        self._drain_timeout_s = drain_timeout_s
        self._idle_poll_s = idle_poll_s
        self._retiring: dict[str, asyncio.Task[None]] = {}

    async def start(self, model: str, version: str, count: int, *, pool: ReplicaPool) -> list[str]:
        name = deployment_name(self._template, model, version)
        before, after = await asyncio.to_thread(self._scale_by, name, count)
        log.info(
            "autoscaler: deployment %s/%s scaled %d -> %d (%s)", self._namespace, name, before, after, pool
        )
        return []

    async def retire(self, replica: Replica) -> None:
        if replica.replica_id in self._retiring:
            return
        await self._states.update(
            replica.replica_id,
            lambda r: (
                None if r.state == ReplicaState.DRAINING else (ReplicaState.DRAINING, f"drained by {ACTOR}")
            ),
            actor=ACTOR,
        )
        task = asyncio.create_task(self._finish(replica), name=f"retire-{replica.replica_id}")
        self._retiring[replica.replica_id] = task
        task.add_done_callback(lambda _: self._retiring.pop(replica.replica_id, None))

    async def close(self) -> None:
        for task in list(self._retiring.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _finish(self, replica: Replica) -> None:
        num_left = await self._wait_idle(replica)
        name = deployment_name(self._template, replica.model, replica.version)
        try:
            await asyncio.to_thread(self._mark_cheapest, replica.replica_id)
            before, after = await asyncio.to_thread(self._scale_by, name, -1)
            await self._states.remove(replica.replica_id, actor=ACTOR)
        except (KubeError, RegistryError) as exc:
            log.error("autoscaler: replica %s left draining, not removed: %s", replica.replica_id, exc)
            return
        left = "unknown" if num_left is None else str(num_left)
        log.info(
            "autoscaler: replica %s drained (%s requests left), pod marked first to go, deployment %s scaled "
            "%d -> %d",
            replica.replica_id, left, name, before, after,
        )  # fmt: skip

    async def _wait_idle(self, replica: Replica) -> int | None:
        """Requests it holds once it holds none or the drain bound is up (None: its metrics unread)."""
        deadline = time.monotonic() + self._drain_timeout_s
        await asyncio.sleep(min(GATEWAY_PROPAGATION_S, self._drain_timeout_s))
        num_held: int | None = None
        async with httpx.AsyncClient(timeout=2.0) as http:
            while replica.metrics_url:
                try:
                    stats = replica_stats_from_metrics(
                        (await http.get(replica.metrics_url)).text, replica.model
                    )
                    num_held = None if stats is None else stats.num_running + stats.num_waiting
                except httpx.HTTPError:
                    num_held = None
                if num_held == 0 or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(self._idle_poll_s)
        return num_held

    # ---------------------------------------------------------------- blocking API calls (in a thread)

    def _scale_by(self, name: str, delta: int) -> tuple[int, int]:
        try:
            scale = self._apps.read_namespaced_deployment_scale(name, self._namespace)
            before = int(scale.spec.replicas or 0)
            after = max(0, before + delta)
            self._apps.patch_namespaced_deployment_scale(name, self._namespace, {"spec": {"replicas": after}})
        except ApiException as exc:
            raise KubeError(f"deployment {self._namespace}/{name}: {exc.status} {exc.reason}") from None
        except (OSError, Urllib3Error) as exc:  # connection refused, retries exhausted
            raise KubeError(f"deployment {self._namespace}/{name}: API server unreachable: {exc}") from None
        return before, after

    def _mark_cheapest(self, pod: str) -> None:
        body = {"metadata": {"annotations": {DELETION_COST: "-1000"}}}
        try:
            self._core.patch_namespaced_pod(pod, self._namespace, body)
        except ApiException as exc:
            raise KubeError(f"pod {self._namespace}/{pod}: {exc.status} {exc.reason}") from None
        except (OSError, Urllib3Error) as exc:
            raise KubeError(f"pod {self._namespace}/{pod}: API server unreachable: {exc}") from None
