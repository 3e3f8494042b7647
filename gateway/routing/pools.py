"""The gateway's replicas as a routing table names them: one ``ModelScheduler`` per (model, version,
pool), one engine client per replica, kept in step with each new table by ``apply``. Owned by the event
loop.

Pools: a version's general and long-prompt replicas queue in separate schedulers, so a short prompt waits
only behind other short prompts (``gateway.routing.table.choose_pool`` picks the pool); each scheduler's
queue metrics carry its pool as a label.

A replica enters rotation only after this gateway verified it (``verify``: ready at the version, serving
its weights digest) and only if its model's request dialect is one the engine client speaks (``unservable``:
not the text-only llmapi model, not an unknown build target); the client is made for that dialect
(``ReplicaTarget.dialect``); one that fails stays out and is tried again at the next ``apply`` (the registry
follower re-reads every poll interval). A replica the table no longer names is drained (its requests
finish, nothing new goes to it) and its client closed once it holds nothing. A (model, version) whose
scheduler is empty and no longer routed is closed the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gateway.metrics import GatewayMetrics
from gateway.routing.table import ReplicaTarget, RoutingTable
from gateway.scheduling.scheduler import ModelScheduler
from replicas.verify import Verification
from sluice.engine_client import EngineClient
from sluice.engine_client.dialects import UNSERVABLE
from sluice.settings import Settings
from sluice.stores.registry.base import ReplicaPool

log = logging.getLogger(__name__)

ClientFactory = Callable[[ReplicaTarget], EngineClient]
Verifier = Callable[[ReplicaTarget], Awaitable[Verification]]


def unservable(target: ReplicaTarget) -> Verification | None:
    """Why a replica cannot be sent requests whatever it answers (a model this gateway cannot speak to);
    None when it may be verified."""
    if target.dialect is None:
        return Verification(
            False, "its version's build target is unknown to this gateway (no request dialect)"
        )
    if target.dialect in UNSERVABLE:
        return Verification(
            False, f"its version is served by a {target.dialect} model: {UNSERVABLE[target.dialect]}"
        )
    return None


class ReplicaPools:
    def __init__(
        self, settings: Settings, metrics: GatewayMetrics, make_client: ClientFactory, verify: Verifier
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._make_client = make_client
        self._verify = verify
        self._schedulers: dict[tuple[str, str, ReplicaPool], ModelScheduler] = {}
        # replica id -> its target, engine client and key in its scheduler (one key per admission)
        self._in_rotation: dict[str, tuple[ReplicaTarget, EngineClient, str]] = {}
        self._num_admissions = 0
        self._refused: dict[str, str] = {}  # replica id -> why this gateway keeps it out of rotation
        self._closing: set[asyncio.Task[None]] = set()
        self._table = RoutingTable(-1)

    # ----- reads -----
    @property
    def settings(self) -> Settings:
        return self._settings

    def scheduler(
        self, model: str, version: str, pool: ReplicaPool = ReplicaPool.GENERAL
    ) -> ModelScheduler | None:
        return self._schedulers.get((model, version, pool))

    def schedulers_of(self, model: str, version: str) -> dict[ReplicaPool, ModelScheduler]:
        """The version's schedulers that have a replica in rotation, by pool."""
        return {
            pool: scheduler
            for (m, v, pool), scheduler in self._schedulers.items()
            if m == model and v == version and scheduler.replica_ids
        }

    @property
    def num_in_rotation(self) -> int:
        return len(self._in_rotation)

    def report(self) -> dict[str, object]:
        """What /readyz shows: per replica known to the table, in rotation or why not."""
        return {
            "generation": self._table.generation,
            "replicas": {
                rid: {
                    "model": r.model,
                    "version": r.version,
                    "endpoint": r.endpoint,
                    "pool": str(r.pool),
                    "in_rotation": rid in self._in_rotation,
                    **({"refused": self._refused[rid]} if rid in self._refused else {}),
                }
                for rid, r in sorted(self._table.replicas().items())
            },
        }

    # ----- changes -----
    async def add_static(self, model: str, version: str, engine: EngineClient) -> ModelScheduler:
        """A replica known without a registry (``SLUICE_ROUTING=static``, tests): in rotation at once."""
        scheduler = await self._scheduler_for(model, version, ReplicaPool.GENERAL)
        await scheduler.add_replica(engine, engine.replica)
        target = ReplicaTarget(engine.replica, engine.replica, model, version, "")
        self._in_rotation[engine.replica] = (target, engine, engine.replica)
        return scheduler

    async def apply(self, table: RoutingTable) -> None:
        """Bring rotation in step with ``table``: verify and add new replicas, drain the ones it dropped."""
        self._table = table
        wanted = table.replicas()
        for replica_id, (target, _, _) in list(self._in_rotation.items()):
            if wanted.get(replica_id) != target:
                self._drain(replica_id)
        for replica_id in list(self._refused):
            if replica_id not in wanted:
                del self._refused[replica_id]
        await asyncio.gather(*(self._admit(t) for rid, t in wanted.items() if rid not in self._in_rotation))
        for key, scheduler in list(self._schedulers.items()):
            # NOTE: by version, not pool: a pool that lost its replicas keeps its scheduler, whose
            # background task expires what still waits in its queue.
            model, version, _ = key
            version_target = table.models[model].versions.get(version) if model in table.models else None
            takes_nothing = version_target is None or not version_target.replicas
            if version_target is None and not scheduler.replica_ids and scheduler.num_in_flight == 0:
                del self._schedulers[key]
                self._spawn(scheduler.close())
            # The version takes nothing new (draining, rolled back, or no replica of it is ready): what
            # waits for it would wait out its deadline, as its streams finish on a draining replica that
            # takes no more. The router chooses another version for a retry.
            elif takes_nothing and (num_refused := scheduler.refuse_waiting()):
                log.info(
                    "%s version %s left routing: %d waiting request(s) refused with 503 to retry",
                    model, version, num_refused,
                )  # fmt: skip

    async def close(self) -> None:
        for scheduler in self._schedulers.values():
            await scheduler.close()
        for _, engine, _ in self._in_rotation.values():
            await engine.close()
        self._schedulers.clear()
        self._in_rotation.clear()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    # ----- internals -----
    async def _admit(self, target: ReplicaTarget) -> None:
        verdict = unservable(target) or await self._verify(target)
        if not verdict.ok:
            if self._refused.get(target.replica_id) != verdict.detail:
                log.warning("replica %s kept out of rotation: %s", target.replica_id, verdict.detail)
            self._refused[target.replica_id] = verdict.detail
            return
        if self._table.replicas().get(target.replica_id) != target:
            return  # a newer table dropped or changed it while it was being verified
        engine = self._make_client(target)
        await engine.start()
        self._refused.pop(target.replica_id, None)
        # NOTE: a key of its own per admission: the replica's previous admission (another client) may
        # still be draining its requests in the same scheduler.
        self._num_admissions += 1
        key = f"{target.replica_id}#{self._num_admissions}"
        self._in_rotation[target.replica_id] = (target, engine, key)
        await (await self._scheduler_for(target.model, target.version, target.pool)).add_replica(engine, key)
        log.info(
            "replica %s (%s version %s, %s pool) in rotation",
            target.replica_id, target.model, target.version, target.pool,
        )  # fmt: skip

    def _drain(self, replica_id: str) -> None:
        target, _, key = self._in_rotation.pop(replica_id)
        scheduler = self._schedulers.get((target.model, target.version, target.pool))
        if scheduler is not None:
            scheduler.drain_replica(key)
        log.info("replica %s (%s version %s) draining", replica_id, target.model, target.version)

    async def _scheduler_for(self, model: str, version: str, pool: ReplicaPool) -> ModelScheduler:
        scheduler = self._schedulers.get((model, version, pool))
        if scheduler is None:
            scheduler = ModelScheduler(
                model,
                (),
                self._settings,
                self._metrics,
                version=version,
                pool=str(pool),
                on_drained=lambda engine: self._spawn(engine.close()),
            )
            self._schedulers[(model, version, pool)] = scheduler
            await scheduler.start()
        return scheduler

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("closing or starting a routing component failed")

        task = asyncio.get_running_loop().create_task(run())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
