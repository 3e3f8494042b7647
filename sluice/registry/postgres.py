"""The production registry: PostgreSQL through a psycopg async connection pool, with LISTEN/NOTIFY.

Every write first locks the one generation row (``SELECT ... FOR UPDATE``), so registry writers run one
at a time and commit in generation order; it then reads what it decides on, writes, bumps the
generation, appends the audit row and sends ``NOTIFY`` on ``channel``, all in one transaction.
``wait_for_change``: see ``sluice.registry.feed``.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from sluice.db import MigratedPgPool
from sluice.registry.base import (
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
from sluice.registry.changes import (
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
from sluice.registry.feed import ChangeSignal, PgListener, wait_for_generation
from sluice.registry.migrations import COMPONENT, MIGRATIONS, RowCodec, routes_from_rows
from sluice.registry.rollout_plans import plan_move_rollout, plan_start_rollout
from sluice.registry.rollouts import Rollout, RolloutGuard, RolloutMove
from sluice.registry.statements import statements

R = TypeVar("R")
Conn = psycopg.AsyncConnection[Any]
DEFAULT_CHANNEL = "sluice_registry"
_SQL = statements("%s")
_CODEC = RowCodec(
    to_utc=lambda at: at.astimezone(UTC),
    from_db_json=lambda value: value,  # psycopg has already parsed JSONB
    to_db_json=Jsonb,
    to_db_time=lambda at: at,
)


async def _rows(conn: Conn, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
    cur = await conn.execute(
        query.encode(), params
    )  # bytes: our own constant SQL (sluice.registry.statements)
    return await cur.fetchall()


async def _model_state(conn: Conn, name: str) -> ModelState:
    found = await _rows(conn, _SQL.select_model, (name,))
    if not found:
        return ModelState(name, None)
    versions = [_CODEC.version(r) for r in await _rows(conn, _SQL.select_versions_of, (name,))]
    routes = routes_from_rows(await _rows(conn, _SQL.select_route_of, (name,)))
    replicas = [_CODEC.replica(r) for r in await _rows(conn, _SQL.select_replicas_of, (name,))]
    rollout = await _rows(conn, _SQL.select_rollout, (name,))
    return ModelState(
        name,
        _CODEC.model(found[0]),
        {v.version: v for v in versions},
        routes[0] if routes else None,
        {r.replica_id: r for r in replicas},
        _CODEC.rollout(rollout[0]) if rollout else None,
    )


async def _replica(conn: Conn, replica_id: str) -> Replica | None:
    found = await _rows(conn, _SQL.select_replica, (replica_id,))
    return _CODEC.replica(found[0]) if found else None


async def _require_replica(conn: Conn, replica_id: str) -> Replica:
    replica = await _replica(conn, replica_id)
    if replica is None:
        raise NotFound(f"no replica {replica_id!r}")
    return replica


async def _record(conn: Conn, change: Change[Any], actor: str, now: datetime, channel: str) -> None:
    """Apply ``change`` in the caller's transaction; a change bumps the generation, is audited and
    notified (delivered on commit)."""
    for w in change.writes:
        if isinstance(w, PutModel):
            await conn.execute(_SQL.insert_model.encode(), _CODEC.model_row(w.model))
        elif isinstance(w, PutVersion):
            await conn.execute(_SQL.upsert_version.encode(), _CODEC.version_row(w.version))
        elif isinstance(w, PutRoute):
            await conn.execute(_SQL.delete_route.encode(), (w.route.model,))
            for e in w.route.entries:
                await conn.execute(_SQL.insert_route_entry.encode(), (w.route.model, e.version, e.weight_bp))
        elif isinstance(w, PutReplica):
            await conn.execute(_SQL.upsert_replica.encode(), _CODEC.replica_row(w.replica))
        elif isinstance(w, DeleteReplica):
            await conn.execute(_SQL.delete_replica.encode(), (w.replica_id,))
        elif isinstance(w, PutRollout):
            await conn.execute(_SQL.upsert_rollout.encode(), _CODEC.rollout_row(w.rollout))
    if change.action is None:
        return
    ((generation,),) = await _rows(conn, _SQL.bump_generation)
    entry = AuditEntry(
        generation, now, actor, change.action, change.model, change.subject, change.before, change.after
    )
    await conn.execute(_SQL.insert_audit.encode(), _CODEC.audit_row(entry))
    await conn.execute("SELECT pg_notify(%s, %s)", (channel, str(generation)))


def _unavailable(exc: BaseException) -> RegistryUnavailable:
    return RegistryUnavailable(f"model registry (PostgreSQL) unavailable: {exc}")


class PostgresRegistry(Registry):
    """``pool_acquire_timeout_s``: how long a call waits for a pooled connection before it raises
    ``RegistryUnavailable`` (during an outage). ``poll_interval_s``: how often waiters read the generation
    while the LISTEN connection is down; ``listen_check_interval_s``: while it is up (a guard against a
    notification lost silently); ``listen_retry_initial_s`` doubling to ``listen_retry_max_s``: how soon
    a lost LISTEN connection is retried."""

    def __init__(
        self,
        url: str,
        *,
        pool_max_size: int = 5,
        pool_acquire_timeout_s: float = 30.0,
        channel: str = DEFAULT_CHANNEL,
        poll_interval_s: float = 0.2,
        listen_check_interval_s: float = 5.0,
        listen_retry_initial_s: float = 0.5,
        listen_retry_max_s: float = 30.0,
    ) -> None:
        self._db = MigratedPgPool(
            url,
            max_size=pool_max_size,
            name="registry",
            component=COMPONENT,
            migrations=MIGRATIONS,
            acquire_timeout_s=pool_acquire_timeout_s,
        )
        self._channel = channel
        self._poll_interval_s = poll_interval_s
        self._listen_check_interval_s = listen_check_interval_s
        self._signal = ChangeSignal()
        self._listener = PgListener(
            url,
            channel,
            self._signal,
            retry_initial_s=listen_retry_initial_s,
            retry_max_s=listen_retry_max_s,
        )

    @property
    def is_listening(self) -> bool:
        """Whether changes arrive by NOTIFY now (else waiters poll)."""
        return self._listener.is_listening

    async def open(self, *, keep_trying: bool = False) -> None:
        """``keep_trying``: a server's start, see ``sluice.db.MigratedPgPool``."""
        await self._db.open_or(_unavailable, keep_trying=keep_trying)
        self._listener.start()

    async def close(self) -> None:
        await self._listener.stop()
        await self._db.close()

    def _connection(self) -> AbstractAsyncContextManager[Conn]:
        """A pooled connection; the server or network failing, here or in the caller's block, raises
        ``RegistryUnavailable`` (the driver's types stay inside this backend)."""
        return self._db.connection_or(_unavailable)

    async def _write(self, actor: str, decide: Callable[[Conn, datetime], Awaitable[Change[R]]]) -> R:
        """One change in one transaction (see the module docstring and ``sluice.registry.changes``)."""
        check_actor(actor)
        async with self._connection() as conn, conn.transaction():
            await conn.execute("SELECT generation FROM registry_generation WHERE id = 1 FOR UPDATE")
            now = datetime.now(UTC)
            change = await decide(conn, now)
            await _record(conn, change, actor, now, self._channel)
        if change.action is not None:
            self._signal.notify()  # this object's waiters need not wait for the round trip
        return change.result

    async def _read(self, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
        async with self._connection() as conn:
            return await _rows(conn, query, params)

    async def _model(self, name: str) -> ModelState:
        async with self._connection() as conn, conn.transaction():
            return await _model_state(conn, name)

    # ---- models

    async def create_model(self, name: str, *, actor: str, description: str = "") -> Model:
        async def decide(conn: Conn, now: datetime) -> Change[Model]:
            return plan_create_model(await _model_state(conn, name), description, now)

        return await self._write(actor, decide)

    async def get_model(self, name: str) -> Model:
        return (await self._model(name)).require_model()

    async def list_models(self) -> builtins.list[Model]:
        return [_CODEC.model(r) for r in await self._read(_SQL.select_models)]

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
        async def decide(conn: Conn, now: datetime) -> Change[ModelVersion]:
            return plan_add_version(
                await _model_state(conn, model),
                version,
                artifact_uri=artifact_uri,
                weights_digest=weights_digest,
                build_config=build_config,
                now=now,
            )

        return await self._write(actor, decide)

    async def get_version(self, model: str, version: str) -> ModelVersion:
        return (await self._model(model)).require_version(version)

    async def list_versions(self, model: str) -> builtins.list[ModelVersion]:
        state = await self._model(model)
        state.require_model()
        return list(state.versions.values())

    async def set_version_state(
        self, model: str, version: str, state: VersionState, *, actor: str
    ) -> ModelVersion:
        async def decide(conn: Conn, now: datetime) -> Change[ModelVersion]:
            return plan_version_state(await _model_state(conn, model), version, state, now)

        return await self._write(actor, decide)

    # ---- routes

    async def set_route(
        self,
        model: str,
        weights_bp: Mapping[str, int],
        *,
        actor: str,
        version_states: Mapping[str, VersionState] | None = None,
    ) -> Route:
        async def decide(conn: Conn, now: datetime) -> Change[Route]:
            return plan_route(await _model_state(conn, model), weights_bp, version_states, now)

        return await self._write(actor, decide)

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
        async def decide(conn: Conn, now: datetime) -> Change[Replica]:
            return plan_register_replica(
                await _model_state(conn, model),
                await _replica(conn, replica_id),
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
        async def decide(conn: Conn, now: datetime) -> Change[Replica]:
            return plan_health(await _require_replica(conn, replica_id), state, detail, now)

        return await self._write(actor, decide)

    async def set_replica_pool(self, replica_id: str, pool: ReplicaPool, *, actor: str) -> Replica:
        async def decide(conn: Conn, now: datetime) -> Change[Replica]:
            return plan_replica_pool(await _require_replica(conn, replica_id), pool, now)

        return await self._write(actor, decide)

    async def get_replica(self, replica_id: str) -> Replica:
        async with self._connection() as conn:
            return await _require_replica(conn, replica_id)

    async def list_replicas(self, model: str | None = None) -> builtins.list[Replica]:
        if model is None:
            rows = await self._read(_SQL.select_replicas)
        else:
            rows = await self._read(_SQL.select_replicas_of, (model,))
        return [_CODEC.replica(r) for r in rows]

    async def remove_replica(self, replica_id: str, *, actor: str) -> None:
        async def decide(conn: Conn, now: datetime) -> Change[None]:
            return plan_remove_replica(await _require_replica(conn, replica_id))

        await self._write(actor, decide)

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
        async def decide(conn: Conn, now: datetime) -> Change[Rollout]:
            return plan_start_rollout(
                await _model_state(conn, model),
                canary_version,
                steps_bp=steps_bp,
                guard=guard,
                actor=actor,
                reason=reason,
                now=now,
            )

        return await self._write(actor, decide)

    async def move_rollout(
        self,
        model: str,
        move: RolloutMove,
        *,
        actor: str,
        reason: str = "",
        expected_step_started_at: datetime | None = None,
    ) -> Rollout:
        async def decide(conn: Conn, now: datetime) -> Change[Rollout]:
            return plan_move_rollout(
                await _model_state(conn, model),
                move,
                reason=reason,
                now=now,
                expected_step_started_at=expected_step_started_at,
            )

        return await self._write(actor, decide)

    async def get_rollout(self, model: str) -> Rollout | None:
        state = await self._model(model)
        state.require_model()
        return state.rollout

    async def list_rollouts(self, *, active_only: bool = False) -> builtins.list[Rollout]:
        query = _SQL.select_active_rollouts if active_only else _SQL.select_rollouts
        return [_CODEC.rollout(r) for r in await self._read(query)]

    # ---- generation, snapshot, audit, change feed

    async def generation(self) -> int:
        ((generation,),) = await self._read(_SQL.select_generation)
        return int(generation)

    async def snapshot(self) -> RegistrySnapshot:
        async with self._connection() as conn, conn.transaction():
            # NOTE: repeatable read: every statement below sees the same committed state.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            ((generation,),) = await _rows(conn, _SQL.select_generation)
            return RegistrySnapshot(
                generation=int(generation),
                models=tuple(_CODEC.model(r) for r in await _rows(conn, _SQL.select_models)),
                versions=tuple(_CODEC.version(r) for r in await _rows(conn, _SQL.select_versions)),
                replicas=tuple(_CODEC.replica(r) for r in await _rows(conn, _SQL.select_replicas)),
                routes=tuple(routes_from_rows(await _rows(conn, _SQL.select_routes))),
            )

    async def audit(self, limit: int = 100, model: str | None = None) -> builtins.list[AuditEntry]:
        check_limit(limit)
        if model is None:
            rows = await self._read(_SQL.select_audit, (limit,))
        else:
            rows = await self._read(_SQL.select_audit_of, (model, limit))
        return [_CODEC.audit(r) for r in rows]

    async def changes(self, after_generation: int, limit: int = 1000) -> builtins.list[AuditEntry]:
        check_limit(limit)
        return [_CODEC.audit(r) for r in await self._read(_SQL.select_changes, (after_generation, limit))]

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        def poll_interval_s() -> float:
            listening = self._listener.is_listening
            return self._listen_check_interval_s if listening else self._poll_interval_s

        return await wait_for_generation(
            self.generation, self._signal, after_generation, timeout_s, poll_interval_s
        )
