"""Local replicas: the actuator every test and ``make run`` use. It starts tritonserver processes serving a
registered model version on this machine, registers them, drains and stops them.

``start(model, version, count, checkpoint)``: the version must be a Triton version (a positive integer).
Its weights come from ``checkpoint`` (a local folder) or else from the version's artifact
(``sluice.artifacts``): a local folder (``file://``, a path), checked before anything is registered; or an
``s3://`` artifact of the weight store, whose manifest is read before anything is registered and which
each replica pulls into the node's weight cache when it starts (nothing downloaded when the cache holds
it). Per replica it picks free loopback ports, registers the replica ``starting`` at
``127.0.0.1:<grpc port>`` (metrics at ``http://127.0.0.1:<metrics port>/metrics``, where gateways read its
load) and returns; in the background it brings the replica up in four phases, each timed
(``ColdStart``, logged, and given by ``cold_start(replica_id)`` to the admin API): download (the
artifact into the cache), verify (the local folder holds the registry's weights; see
``replica_weights``), load (its model repository rendered under ``<state_dir>/replicas/<replica_id>/``,
config carrying the registry's digest, tritonserver started until ready), first token
(``verify_replica`` and one probe generation).
Then it records the replica ``ready`` (or ``failed`` with the reason, its process stopped); while
starting, its health detail names the phase it is in.

``drain``: the replica is set ``draining`` (gateways send it nothing new; requests in flight finish).
``stop``: drain, wait until the replica holds no request (its Triton metrics) or ``timeout_s``, stop the
process (SIGTERM, then SIGKILL of its group) and remove the replica from the registry.

The processes are children of this service: they stop with it (``close()``; and the kernel SIGTERMs them
if the service dies, see ``replicas.launcher``). A replica folder left by an earlier run (a service
killed hard) is removed at ``open()``, with its replica's registry row. One control plane per state folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from replicas.health import CHECK_TIMEOUT_S, Probe, ReplicaStates, Verify
from replicas.local_replica import (
    InvalidReplicaRequest,
    LocalReplica,
    launch_failure,
    triton_version,
)
from replicas.probe import probe_replica
from replicas.render import CpuEngineModelSettings, DTypeSetting
from replicas.replica_weights import (
    ColdStart,
    PullFailed,
    check_local_folder,
    check_remote_artifact,
    engine_settings,
    pull_weights,
)
from replicas.verify import Verification, verify_replica
from sluice.artifacts import StoreFactory, local_artifact_dir
from sluice.settings import get_settings
from sluice.stores.registry.base import (
    ModelVersion,
    NotFound,
    RegistryError,
    Replica,
    ReplicaPool,
    ReplicaState,
    VersionState,
)
from sluice.weight_store import WeightStore

log = logging.getLogger("sluice.replicas")

T = TypeVar("T")

MAX_REPLICAS_PER_START = 8
DEFAULT_STOP_TIMEOUT_S = 30.0
RECOVERY_RETRY_S = 2.0
VERIFY_RETRY_S = 15.0
VERIFY_RETRY_INTERVAL_S = 0.5
# The first generation of a freshly loaded engine: longer than a health check's probe allows a warm one.
FIRST_TOKEN_TIMEOUT_S = 15.0

__all__ = ["InvalidReplicaRequest", "LocalReplicas", "ReplicaConflict", "StopReport"]


class ReplicaConflict(Exception):
    """The replica's state or owner refuses the operation; the message says what to do (an HTTP 409)."""


def _store_from_settings() -> WeightStore:
    return WeightStore.from_settings(get_settings(), quiet=True)


@dataclass(frozen=True)
class StopReport:
    replica_id: str
    waited_s: float  # from the stop's start to its process gone
    num_in_flight_left: int | None  # requests still on it when it was stopped; None: unknown


class LocalReplicas:
    """The actuator (see the module docstring). ``open()`` before use, ``close()`` stops everything."""

    def __init__(
        self,
        states: ReplicaStates,
        state_dir: Path,
        *,
        engine_dtype: DTypeSetting = "auto",
        ready_timeout_s: float = 60.0,
        verify: Verify = verify_replica,
        probe: Probe = probe_replica,
        weight_store: StoreFactory = _store_from_settings,
    ) -> None:
        self._states = states
        self._registry = states.registry
        self._root = Path(state_dir) / "replicas"
        self._triton_state_dir = Path(state_dir) / "triton"
        self._engine_dtype = engine_dtype
        self._ready_timeout_s = ready_timeout_s
        self._verify = verify
        self._probe = probe
        self._make_store = weight_store
        self._store: WeightStore | None = None  # made at the first s3:// artifact, then shared
        self._store_lock = threading.Lock()  # it is made in a worker thread
        self._local: dict[str, LocalReplica] = {}
        self._stopping: dict[str, asyncio.Task[StopReport]] = {}  # a second stop joins the first
        # NOTE: tritonserver dies with the thread that forked it (PR_SET_PDEATHSIG): these threads live
        # until close(), the default executor's might not.
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="local-replica")
        self._recovery: asyncio.Task[None] | None = None
        self._closing = False

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def is_local(self, replica_id: str) -> bool:
        return replica_id in self._local

    def launch_failed(self, replica_id: str) -> bool:
        """This service launched the replica and the launch failed: its process is stopped, its registry
        row says why (the health checks leave it alone)."""
        local = self._local.get(replica_id)
        return local is not None and local.cold_start.phase == "failed"

    def launch_owns_state(self, replica_id: str) -> bool:
        """This service's launch of the replica is in progress or failed: the launch records its state
        (``ready`` after its own first-token check), so the health checks leave it alone until then. A
        check passing as soon as tritonserver answered marked it ready before its load was recorded."""
        local = self._local.get(replica_id)
        return local is not None and local.cold_start.phase != "ready"

    def cold_start(self, replica_id: str) -> ColdStart | None:
        """The phases of a replica's start so far (this service's replicas only; None otherwise)."""
        local = self._local.get(replica_id)
        return None if local is None else local.cold_start

    def _weight_store(self) -> WeightStore:
        with self._store_lock:
            if self._store is None:
                self._store = self._make_store()
            return self._store

    # ------------------------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        leftovers = sorted(p for p in self._root.iterdir() if p.is_dir())
        if leftovers:
            self._recovery = asyncio.create_task(self._recover(leftovers), name="local-replica-recovery")

    async def _recover(self, folders: list[Path]) -> None:
        """Replicas of an earlier run died with it: take them out of the registry, then their folders."""
        while folders:
            try:
                if await self._states.remove(folders[0].name, actor="control-plane/local-replicas"):
                    log.info(
                        "replica %s was started by an earlier run of this control plane; its process is "
                        "gone: removed from the registry",
                        folders[0].name,
                    )
            except RegistryError as exc:
                log.warning("leftover replicas not cleaned up yet (registry: %s); retrying", exc)
                await asyncio.sleep(RECOVERY_RETRY_S)
                continue
            shutil.rmtree(folders.pop(0), ignore_errors=True)

    async def close(self) -> None:
        """Take every local replica out of the registry (so gateways stop routing to them), then stop
        their processes; a replica still loading is killed."""
        self._closing = True
        if self._recovery is not None:
            self._recovery.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recovery
        replicas = list(self._local.values())
        for local in replicas:
            try:
                await self._states.remove(local.replica_id, actor="control-plane/shutdown")
            except RegistryError as exc:  # the next start removes it (its folder stays until then)
                log.warning("replica %s not removed from the registry: %s", local.replica_id, exc)
        await asyncio.gather(*(self._abort_launch(local) for local in replicas))
        await asyncio.gather(*(self._run(local.server.stop) for local in replicas))
        for local in replicas:
            shutil.rmtree(local.folder, ignore_errors=True)
            log.info("replica %s stopped with the control plane", local.replica_id)
        self._local.clear()
        self._executor.shutdown(wait=True)

    async def _abort_launch(self, local: LocalReplica) -> None:
        while local.launch is not None and not local.launch.done():
            if local.server.pid is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(local.server.pid, signal.SIGKILL)
            await asyncio.wait({local.launch}, timeout=0.2)

    # ---------------------------------------------------------------------------------------- start

    async def start(
        self,
        model: str,
        version: str,
        count: int,
        checkpoint: Path | None,
        *,
        actor: str,
        pool: ReplicaPool = ReplicaPool.GENERAL,
    ) -> list[Replica]:
        """Register ``count`` replicas ``starting`` in ``pool`` and launch them in the background (module
        docstring). ``InvalidReplicaRequest`` for what cannot be started; the registry's ``NotFound``."""
        number = triton_version(version)
        if not 1 <= count <= MAX_REPLICAS_PER_START:
            raise InvalidReplicaRequest(f"count must be in 1..{MAX_REPLICAS_PER_START}, got {count}")
        found = await self._registry.get_version(model, version)
        if found.state == VersionState.RETIRED:
            raise InvalidReplicaRequest(f"{model} version {version} is retired: it is never served again")
        source = str(checkpoint) if checkpoint is not None else found.artifact_uri
        folder = checkpoint or local_artifact_dir(source)
        # NOTE: an s3:// artifact's folder is known once fetched; the settings are checked now.
        settings = engine_settings(found, number, folder or Path(), self._engine_dtype)
        cold_start = ColdStart(source)
        if folder is not None:
            verify_s = await self._run(check_local_folder, found, folder)
            cold_start = ColdStart(source, download_s=0.0, verify_s=verify_s, verified_by="weights digest")
        else:
            await self._run(check_remote_artifact, found, self._weight_store)
        return [await self._launch(settings, found, replace(cold_start), actor, pool) for _ in range(count)]

    async def _launch(
        self,
        settings: CpuEngineModelSettings,
        found: ModelVersion,
        cold_start: ColdStart,
        actor: str,
        pool: ReplicaPool,
    ) -> Replica:
        local = await self._run(
            LocalReplica.prepare, self._root, found.model, found.version, found.weights_digest, cold_start,
            self._triton_state_dir, self._ready_timeout_s,
        )  # fmt: skip
        replica_id, model, version, folder = local.replica_id, local.model, local.version, local.folder
        try:
            replica = await self._states.register(
                replica_id, endpoint=local.endpoint, model=model, version=version, actor=actor,
                state=ReplicaState.STARTING, detail="starting", metrics_url=local.metrics_url,
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if pool != replica.pool:  # while it is starting: no gateway routes to it before this
            try:
                replica = await self._registry.set_replica_pool(replica_id, pool, actor=actor)
            except BaseException:
                with contextlib.suppress(RegistryError):
                    await self._states.remove(replica_id, actor=actor)
                shutil.rmtree(folder, ignore_errors=True)
                raise
        self._local[replica_id] = local
        local.launch = asyncio.create_task(
            self._bring_up(local, settings, found, actor), name=f"launch-{replica_id}"
        )
        log.info("replica %s (%s version %s) starting at %s", replica_id, model, version, local.endpoint)
        return replica

    async def _bring_up(
        self, local: LocalReplica, settings: CpuEngineModelSettings, found: ModelVersion, actor: str
    ) -> None:
        """The four phases (module docstring); the outcome recorded, the cold start logged."""
        cold = local.cold_start
        try:
            if cold.download_s is None:  # a remote artifact
                detail = f"downloading {cold.artifact_uri} into the weight cache, then verifying it"
                await self._phase(local, "download", detail, actor)
                weights = await self._run(pull_weights, cold, found, self._weight_store)
                settings = replace(settings, checkpoint_dir=weights)
            await self._phase(local, "load", "loading: tritonserver starting", actor)
            started_s = time.monotonic()
            await self._run(local.render, settings)
            await self._run(local.server.start)
            cold.load_s = time.monotonic() - started_s
        except PullFailed as exc:
            await self._fail(local, str(exc), actor)
            return
        except Exception as exc:  # TritonLaunchError; or the launch killed by close()
            if not self._closing:
                await self._fail(local, launch_failure(exc), actor)
            return
        if self._closing:
            return
        await self._phase(local, "first token", "warming up: verifying, then a first token", actor)
        started_s = time.monotonic()
        problem = await self._first_token(local)
        if problem:
            await self._run(local.server.stop)
            await self._fail(local, f"{problem}; its tritonserver was stopped", actor)
            return
        cold.first_token_s = time.monotonic() - started_s
        cold.phase = "ready"
        await self._record(local, ReplicaState.READY, "", actor)
        log.info(
            "replica %s ready and verified at %s (%s version %s); cold start: %s",
            local.replica_id, local.endpoint, local.model, local.version, cold.describe(),
        )  # fmt: skip

    async def _first_token(self, local: LocalReplica) -> str:
        """Why the replica does not serve its version yet ("" when it does): verified, then probed."""
        result = await self._verify_launched(local)
        if not result.ok:
            return f"verification failed: {result.detail}"
        probed = await self._probe(local.endpoint, local.model, local.version, FIRST_TOKEN_TIMEOUT_S)
        return "" if probed.ok else f"no first token: {probed.detail}"

    async def _phase(self, local: LocalReplica, phase: str, detail: str, actor: str) -> None:
        """Enter ``phase``: the replica's health detail says so while it is starting."""
        local.cold_start.phase = phase
        await self._record(local, ReplicaState.STARTING, detail, actor)

    async def _fail(self, local: LocalReplica, detail: str, actor: str) -> None:
        local.cold_start.phase = "failed"
        log.warning("replica %s failed to start: %s (cold start: %s)", local.replica_id, detail,
                    local.cold_start.describe())  # fmt: skip
        await self._record(local, ReplicaState.FAILED, detail, actor)

    async def _verify_launched(self, local: LocalReplica) -> Verification:
        """Verify a replica Triton reports ready, retrying failures for ``VERIFY_RETRY_S``.

        NOTE: gRPC shares a reconnect backoff between channels to one address; a health check that ran
        while the replica loaded leaves one, and the first checks after it is ready fail without trying.
        """
        deadline = time.monotonic() + VERIFY_RETRY_S
        while True:
            result = await self._verify(
                local.endpoint, local.model, local.version, local.digest, CHECK_TIMEOUT_S
            )
            if result.ok or self._closing or time.monotonic() >= deadline:
                return result
            await asyncio.sleep(VERIFY_RETRY_INTERVAL_S)

    async def _record(self, local: LocalReplica, state: ReplicaState, detail: str, actor: str) -> None:
        """The launch's outcome, unless the replica left ``starting`` meanwhile (drained, stopped)."""
        try:
            await self._states.update(
                local.replica_id,
                lambda current: (state, detail) if current.state == ReplicaState.STARTING else None,
                actor=actor,
            )
        except RegistryError as exc:  # the health checks record it once the registry answers
            log.warning("replica %s: %s not recorded: %s", local.replica_id, state, exc)

    # ---------------------------------------------------------------------------- drain, stop, remove

    async def drain(self, replica_id: str, *, actor: str) -> Replica:
        """Set any registered replica ``draining``; ``NotFound``, or ``ReplicaConflict`` when stopped."""

        def decide(current: Replica) -> tuple[ReplicaState, str] | None:
            if current.state == ReplicaState.STOPPED:
                raise ReplicaConflict(f"replica {replica_id} is stopped: there is nothing to drain")
            if current.state == ReplicaState.DRAINING:
                return None
            return ReplicaState.DRAINING, f"drained by {actor}"

        changed = await self._states.update(replica_id, decide, actor=actor)
        if changed is None:
            raise NotFound(f"no replica {replica_id!r}")
        before, after = changed
        if before.state != after.state:
            log.info("replica %s draining (was %s), by %s", replica_id, before.state, actor)
        return after

    async def stop(
        self, replica_id: str, *, actor: str, timeout_s: float = DEFAULT_STOP_TIMEOUT_S, wait: bool = True
    ) -> StopReport | None:
        """Drain, wait until idle or ``timeout_s``, stop the process, remove the replica. Only for
        replicas this service started (``ReplicaConflict`` otherwise); a second call joins the first.
        ``wait=False``: return once drained, the rest in the background (None; its outcome is logged)."""
        local = self._local.get(replica_id)
        if local is None:
            await self._registry.get_replica(replica_id)  # NotFound
            raise ReplicaConflict(
                f"replica {replica_id} was not started by this control plane: drain it, stop its process, "
                f"then remove it (DELETE /admin/v1/replicas/{replica_id})"
            )
        stopping = self._stopping.get(replica_id)
        if stopping is None:
            if not wait:  # so that the answer can say it is draining
                with contextlib.suppress(ReplicaConflict):
                    await self.drain(replica_id, actor=actor)
            stopping = asyncio.create_task(self._stop(local, actor, timeout_s), name=f"stop-{replica_id}")
            stopping.add_done_callback(lambda task: self._stop_done(replica_id, task))
            self._stopping[replica_id] = stopping
        if not wait:
            return None
        return await asyncio.shield(stopping)

    def _stop_done(self, replica_id: str, task: asyncio.Task[StopReport]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self._stopping.pop(replica_id, None)  # a later stop may try again
        log.warning("stopping replica %s failed: %s", replica_id, task.exception())

    async def _stop(self, local: LocalReplica, actor: str, timeout_s: float) -> StopReport:
        started_s = time.monotonic()
        if local.launch is not None:
            await asyncio.shield(local.launch)  # ends on its own: ready, failed, or its timeout
        with contextlib.suppress(NotFound, ReplicaConflict):
            await self.drain(local.replica_id, actor=actor)
        num_left = await local.wait_idle(timeout_s) if local.server.is_running() else 0
        await self._run(local.server.stop)
        await self._states.remove(local.replica_id, actor=actor)
        self._local.pop(local.replica_id, None)
        self._stopping.pop(local.replica_id, None)
        shutil.rmtree(local.folder, ignore_errors=True)
        waited_s = time.monotonic() - started_s
        left = "unknown" if num_left is None else str(num_left)
        log.info(
            "replica %s stopped by %s after %.1f s (%s requests left in flight), removed from the registry",
            local.replica_id,
            actor,
            waited_s,
            left,
        )
        return StopReport(local.replica_id, round(waited_s, 3), num_left)

    async def deregister(self, replica_id: str, *, actor: str) -> None:
        """Remove an externally started replica from the registry (its process is its owner's)."""
        if replica_id in self._local:
            raise ReplicaConflict(
                f"replica {replica_id} was started by this control plane: stop it "
                f"(POST /admin/v1/replicas/{replica_id}/stop)"
            )
        if not await self._states.remove(replica_id, actor=actor):
            raise NotFound(f"no replica {replica_id!r}")
        log.info("replica %s removed from the registry by %s", replica_id, actor)
