"""The registry's one body, on SQLite (the embedded default) or PostgreSQL (production), run on either by
``sluice.stores.transactions``; ``sluice.stores.registry.sqlite`` / ``sluice.stores.registry.postgres`` build
the runner and add how each learns of changes (``wait_for_change``).

Every write is one serialised transaction: on PostgreSQL it first locks the one generation row (``SELECT
... FOR UPDATE``), so writers run one at a time and commit in generation order; on SQLite ``BEGIN
IMMEDIATE`` does that (across processes too). It then reads what it decides on, applies the ``plan_*``
function's writes (``sluice.stores.registry.changes``), bumps the generation and appends the audit row; on
PostgreSQL it also sends ``NOTIFY`` on the channel, delivered on commit (``sluice.stores.registry.feed``).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from sluice.stores.registry.base import (
    AuditEntry,
    Model,
    ModelVersion,
    NotFound,
    Registry,
    RegistrySnapshot,
    RegistryUnavailable,
    Replica,
    ReplicaPool,
    ReplicaState,
    Route,
    VersionState,
    check_actor,
    check_limit,
)
from sluice.stores.registry.changes import (
    Change,
    DeleteReplica,
    ModelState,
    PutModel,
    PutReplica,
    PutRollout,
    PutRoute,
    PutVersion,
    plan_add_version,
    plan_create_model,
    plan_health,
    plan_register_replica,
    plan_remove_replica,
    plan_replica_pool,
    plan_route,
    plan_version_state,
)
from sluice.stores.registry.feed import ChangeSignal
from sluice.stores.registry.migrations import COMPONENT, MIGRATIONS, RowCodec, routes_from_rows
from sluice.stores.registry.rollout_plans import plan_move_rollout, plan_start_rollout
from sluice.stores.registry.rollouts import Rollout, RolloutGuard, RolloutMove
from sluice.stores.registry.statements import SQL
from sluice.stores.transactions import SqlRunner, StoreSchema, Tx

R = TypeVar("R")
DEFAULT_CHANNEL = "sluice_registry"


async def _model_state(tx: Tx, name: str) -> ModelState:
    row = await tx.fetchone(SQL.select_model, (name,))
    if row is None:
        return ModelState(name, None)
    codec = RowCodec(tx.codecs)
    versions = [codec.version(r) for r in await tx.fetchall(SQL.select_versions_of, (name,))]
    routes = routes_from_rows(await tx.fetchall(SQL.select_route_of, (name,)))
    replicas = [codec.replica(r) for r in await tx.fetchall(SQL.select_replicas_of, (name,))]
    rollout = await tx.fetchone(SQL.select_rollout, (name,))
    return ModelState(
        name,
        codec.model(row),
        {v.version: v for v in versions},
        routes[0] if routes else None,
        {r.replica_id: r for r in replicas},
        None if rollout is None else codec.rollout(rollout),
    )


async def _replica(tx: Tx, replica_id: str) -> Replica | None:
    row = await tx.fetchone(SQL.select_replica, (replica_id,))
    return None if row is None else RowCodec(tx.codecs).replica(row)


async def _require_replica(tx: Tx, replica_id: str) -> Replica:
    replica = await _replica(tx, replica_id)
    if replica is None:
        raise NotFound(f"no replica {replica_id!r}")
    return replica


async def _record(tx: Tx, change: Change[Any], actor: str, now: datetime, channel: str) -> None:
    """Apply ``change`` in the caller's transaction; a change bumps the generation, is audited and (on
    PostgreSQL) notified on ``channel``."""
    codec = RowCodec(tx.codecs)
    for w in change.writes:
        if isinstance(w, PutModel):
            await tx.execute(SQL.insert_model, codec.model_row(w.model))
        elif isinstance(w, PutVersion):
            await tx.execute(SQL.upsert_version, codec.version_row(w.version))
        elif isinstance(w, PutRoute):
            await tx.execute(SQL.delete_route, (w.route.model,))
            for e in w.route.entries:
                await tx.execute(SQL.insert_route_entry, (w.route.model, e.version, e.weight_bp))
        elif isinstance(w, PutReplica):
            await tx.execute(SQL.upsert_replica, codec.replica_row(w.replica))
        elif isinstance(w, DeleteReplica):
            await tx.execute(SQL.delete_replica, (w.replica_id,))
        elif isinstance(w, PutRollout):
            await tx.execute(SQL.upsert_rollout, codec.rollout_row(w.rollout))
    if change.action is None:
        return
    ((generation,),) = await tx.fetchall(SQL.bump_generation)
    entry = AuditEntry(
        generation, now, actor, change.action, change.model, change.subject, change.before, change.after
    )
    await tx.execute(SQL.insert_audit, codec.audit_row(entry))
    if tx.dialect == "postgresql":
        await tx.execute(SQL.notify, (channel, str(generation)))


class SqlRegistry(Registry):
    """Every registry call once, over ``runner``; a backend's subclass builds the runner and says how
    ``wait_for_change`` learns of changes. ``channel``: where PostgreSQL's writes NOTIFY."""

    def __init__(self, runner: SqlRunner, *, channel: str = DEFAULT_CHANNEL) -> None:
        self._db = runner
        self._channel = channel
        self._signal = ChangeSignal()

    async def open(self) -> None:
        await self._db.open()

    async def close(self) -> None:
        await self._db.close()

    async def _write(self, actor: str, decide: Callable[[Tx, datetime], Awaitable[Change[R]]]) -> R:
        """One change in one serialised transaction (see the module docstring)."""
        check_actor(actor)

        async def write(tx: Tx) -> Change[R]:
            if tx.dialect == "postgresql":
                await tx.execute(SQL.lock_generation)
            now = datetime.now(UTC)
            change = await decide(tx, now)
            await _record(tx, change, actor, now, self._channel)
            return change

        change = await self._db.write(write)
        if change.action is not None:
            self._signal.notify()  # this object's waiters need not wait for a poll or a NOTIFY
        return change.result

    async def _write_model(
        self, actor: str, name: str, plan: Callable[[ModelState, datetime], Change[R]]
    ) -> R:
        async def decide(tx: Tx, now: datetime) -> Change[R]:
            return plan(await _model_state(tx, name), now)

        return await self._write(actor, decide)

    async def _write_replica(
        self, actor: str, replica_id: str, plan: Callable[[Replica, datetime], Change[R]]
    ) -> R:
        async def decide(tx: Tx, now: datetime) -> Change[R]:
            return plan(await _require_replica(tx, replica_id), now)

        return await self._write(actor, decide)

    async def _model(self, name: str) -> ModelState:
        """One model in one snapshot: its versions, route, replicas and rollout agree."""

        async def read(tx: Tx) -> ModelState:
            return await _model_state(tx, name)

        return await self._db.read(read)

    async def _decoded(
        self, decode: Callable[[RowCodec, Any], R], sql: str, params: tuple[Any, ...] = ()
    ) -> builtins.list[R]:
        """One statement's rows (a snapshot by itself), each through ``decode``."""

        async def read(tx: Tx) -> builtins.list[R]:
            codec = RowCodec(tx.codecs)
            return [decode(codec, r) for r in await tx.fetchall(sql, params)]

        return await self._db.run(read)

    # ---- models

    async def create_model(self, name: str, *, actor: str, description: str = "") -> Model:
        return await self._write_model(actor, name, lambda s, now: plan_create_model(s, description, now))

    async def get_model(self, name: str) -> Model:
        return (await self._model(name)).require_model()

    async def list_models(self) -> builtins.list[Model]:
        return await self._decoded(RowCodec.model, SQL.select_models)

    # ---- versions

    async def add_version(
        self,
        model: str,
        version: str,
        *,
        artifact_uri: str,
        weights_digest: str,
        build_config: Mapping[str, Any],
        actor: str,
    ) -> ModelVersion:
        def plan(state: ModelState, now: datetime) -> Change[ModelVersion]:
            return plan_add_version(
                state,
                version,
                artifact_uri=artifact_uri,
                weights_digest=weights_digest,
                build_config=build_config,
                now=now,
            )

        return await self._write_model(actor, model, plan)

    async def get_version(self, model: str, version: str) -> ModelVersion:
        return (await self._model(model)).require_version(version)

    async def list_versions(self, model: str) -> builtins.list[ModelVersion]:
        state = await self._model(model)
        state.require_model()
        return list(state.versions.values())

    async def set_version_state(
        self, model: str, version: str, state: VersionState, *, actor: str
    ) -> ModelVersion:
        return await self._write_model(
            actor, model, lambda s, now: plan_version_state(s, version, state, now)
        )

    # ---- routes

    async def set_route(
        self,
        model: str,
        weights_bp: Mapping[str, int],
        *,
        actor: str,
        version_states: Mapping[str, VersionState] | None = None,
    ) -> Route:
        return await self._write_model(
            actor, model, lambda s, now: plan_route(s, weights_bp, version_states, now)
        )

    async def get_route(self, model: str) -> Route | None:
        state = await self._model(model)
        state.require_model()
        return state.route

    # ---- replicas

    async def register_replica(
        self,
        replica_id: str,
        *,
        endpoint: str,
        model: str,
        version: str,
        actor: str,
        state: ReplicaState = ReplicaState.STARTING,
        detail: str = "",
        metrics_url: str = "",
        pool: ReplicaPool = ReplicaPool.GENERAL,
    ) -> Replica:
        async def decide(tx: Tx, now: datetime) -> Change[Replica]:
            return plan_register_replica(
                await _model_state(tx, model),
                await _replica(tx, replica_id),
                replica_id,
                endpoint=endpoint,
                version=version,
                replica_state=state,
                detail=detail,
                metrics_url=metrics_url,
                pool=pool,
                now=now,
            )

        return await self._write(actor, decide)

    async def record_health(
        self, replica_id: str, state: ReplicaState, *, actor: str, detail: str = ""
    ) -> Replica:
        return await self._write_replica(actor, replica_id, lambda r, now: plan_health(r, state, detail, now))

    async def set_replica_pool(self, replica_id: str, pool: ReplicaPool, *, actor: str) -> Replica:
        return await self._write_replica(actor, replica_id, lambda r, now: plan_replica_pool(r, pool, now))

    async def get_replica(self, replica_id: str) -> Replica:
        async def read(tx: Tx) -> Replica:
            return await _require_replica(tx, replica_id)

        return await self._db.run(read)

    async def list_replicas(self, model: str | None = None) -> builtins.list[Replica]:
        if model is None:
            return await self._decoded(RowCodec.replica, SQL.select_replicas)
        return await self._decoded(RowCodec.replica, SQL.select_replicas_of, (model,))

    async def remove_replica(self, replica_id: str, *, actor: str) -> None:
        await self._write_replica(actor, replica_id, lambda r, now: plan_remove_replica(r))

    # ---- rollouts

    async def start_rollout(
        self,
        model: str,
        canary_version: str,
        *,
        steps_bp: tuple[int, ...] | builtins.list[int],
        actor: str,
        guard: RolloutGuard | None = None,
        reason: str = "",
    ) -> Rollout:
        def plan(state: ModelState, now: datetime) -> Change[Rollout]:
            return plan_start_rollout(
                state, canary_version, steps_bp=steps_bp, guard=guard, actor=actor, reason=reason, now=now
            )

        return await self._write_model(actor, model, plan)

    async def move_rollout(
        self,
        model: str,
        move: RolloutMove,
        *,
        actor: str,
        reason: str = "",
        expected_step_started_at: datetime | None = None,
    ) -> Rollout:
        def plan(state: ModelState, now: datetime) -> Change[Rollout]:
            return plan_move_rollout(
                state, move, reason=reason, now=now, expected_step_started_at=expected_step_started_at
            )

        return await self._write_model(actor, model, plan)

    async def get_rollout(self, model: str) -> Rollout | None:
        state = await self._model(model)
        state.require_model()
        return state.rollout

    async def list_rollouts(self, *, active_only: bool = False) -> builtins.list[Rollout]:
        query = SQL.select_active_rollouts if active_only else SQL.select_rollouts
        return await self._decoded(RowCodec.rollout, query)

    # ---- generation, snapshot, audit, change feed

    async def generation(self) -> int:
        async def read(tx: Tx) -> int:
            ((generation,),) = await tx.fetchall(SQL.select_generation)
            return int(generation)

        return await self._db.run(read)

    async def snapshot(self) -> RegistrySnapshot:
        async def read(tx: Tx) -> RegistrySnapshot:
            codec = RowCodec(tx.codecs)
            ((generation,),) = await tx.fetchall(SQL.select_generation)
            return RegistrySnapshot(
                generation=int(generation),
                models=tuple(codec.model(r) for r in await tx.fetchall(SQL.select_models)),
                versions=tuple(codec.version(r) for r in await tx.fetchall(SQL.select_versions)),
                replicas=tuple(codec.replica(r) for r in await tx.fetchall(SQL.select_replicas)),
                routes=tuple(routes_from_rows(await tx.fetchall(SQL.select_routes))),
            )

        # One snapshot: the generation names exactly the state read with it.
        return await self._db.read(read)

    async def audit(self, limit: int = 100, model: str | None = None) -> builtins.list[AuditEntry]:
        check_limit(limit)
        if model is None:
            return await self._decoded(RowCodec.audit, SQL.select_audit, (limit,))
        return await self._decoded(RowCodec.audit, SQL.select_audit_of, (model, limit))

    async def changes(self, after_generation: int, limit: int = 1000) -> builtins.list[AuditEntry]:
        check_limit(limit)
        return await self._decoded(RowCodec.audit, SQL.select_changes, (after_generation, limit))


SCHEMA = StoreSchema("model registry", "registry", COMPONENT, MIGRATIONS, RegistryUnavailable)
