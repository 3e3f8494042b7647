"""The embedded registry: tables in the same SQLite file as the ledger and the tenant store.

Writes are serialised by ``BEGIN IMMEDIATE`` (across processes too), so generations are handed out one
at a time. ``wait_for_change`` polls the generation every ``poll_interval_s`` (SQLite has no
notifications); a write through the same object wakes its waiters at once.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sluice.db import SqliteDb, apply_sqlite_migrations, transaction
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
    Write,
    plan_add_version,
    plan_create_model,
    plan_health,
    plan_register_replica,
    plan_remove_replica,
    plan_replica_pool,
    plan_route,
    plan_version_state,
)
from sluice.registry.feed import ChangeSignal, wait_for_generation
from sluice.registry.migrations import COMPONENT, MIGRATIONS, RowCodec, routes_from_rows
from sluice.registry.rollout_plans import plan_move_rollout, plan_start_rollout
from sluice.registry.rollouts import Rollout, RolloutGuard, RolloutMove
from sluice.registry.statements import statements

T = TypeVar("T")
R = TypeVar("R")
_SQL = statements("?")
_CODEC = RowCodec(
    to_utc=lambda text: datetime.fromisoformat(text).astimezone(UTC),
    from_db_json=json.loads,
    to_db_json=lambda value: json.dumps(value, sort_keys=True),
    to_db_time=lambda at: at.astimezone(UTC).isoformat(timespec="microseconds"),
)


def _unavailable(exc: BaseException) -> RegistryUnavailable:
    return RegistryUnavailable(f"model registry (SQLite) unavailable: {exc}")


def _model_state(conn: sqlite3.Connection, name: str) -> ModelState:
    row = conn.execute(_SQL.select_model, (name,)).fetchone()
    if row is None:
        return ModelState(name, None)
    versions = [_CODEC.version(r) for r in conn.execute(_SQL.select_versions_of, (name,))]
    routes = routes_from_rows(conn.execute(_SQL.select_route_of, (name,)).fetchall())
    replicas = [_CODEC.replica(r) for r in conn.execute(_SQL.select_replicas_of, (name,))]
    rollout = conn.execute(_SQL.select_rollout, (name,)).fetchone()
    return ModelState(
        name,
        _CODEC.model(row),
        {v.version: v for v in versions},
        routes[0] if routes else None,
        {r.replica_id: r for r in replicas},
        None if rollout is None else _CODEC.rollout(rollout),
    )


def _replica(conn: sqlite3.Connection, replica_id: str) -> Replica | None:
    row = conn.execute(_SQL.select_replica, (replica_id,)).fetchone()
    return None if row is None else _CODEC.replica(row)


def _require_replica(conn: sqlite3.Connection, replica_id: str) -> Replica:
    replica = _replica(conn, replica_id)
    if replica is None:
        raise NotFound(f"no replica {replica_id!r}")
    return replica


def _apply(conn: sqlite3.Connection, writes: tuple[Write, ...]) -> None:
    for w in writes:
        if isinstance(w, PutModel):
            conn.execute(_SQL.insert_model, _CODEC.model_row(w.model))
        elif isinstance(w, PutVersion):
            conn.execute(_SQL.upsert_version, _CODEC.version_row(w.version))
        elif isinstance(w, PutRoute):
            conn.execute(_SQL.delete_route, (w.route.model,))
            for e in w.route.entries:
                conn.execute(_SQL.insert_route_entry, (w.route.model, e.version, e.weight_bp))
        elif isinstance(w, PutReplica):
            conn.execute(_SQL.upsert_replica, _CODEC.replica_row(w.replica))
        elif isinstance(w, DeleteReplica):
            conn.execute(_SQL.delete_replica, (w.replica_id,))
        elif isinstance(w, PutRollout):
            conn.execute(_SQL.upsert_rollout, _CODEC.rollout_row(w.rollout))


def _record(conn: sqlite3.Connection, change: Change[Any], actor: str, now: datetime) -> None:
    """Apply ``change`` in the caller's transaction; a change bumps the generation and is audited."""
    _apply(conn, change.writes)
    if change.action is None:
        return
    (generation,) = conn.execute(_SQL.bump_generation).fetchone()
    entry = AuditEntry(
        generation, now, actor, change.action, change.model, change.subject, change.before, change.after
    )
    conn.execute(_SQL.insert_audit, _CODEC.audit_row(entry))


class SqliteRegistry(Registry):
    def __init__(self, path: Path, *, poll_interval_s: float = 0.2) -> None:
        self._db = SqliteDb(path)
        self._poll_interval_s = poll_interval_s
        self._signal = ChangeSignal()

    async def open(self) -> None:
        await self._db.open_or(_unavailable)
        await self._run(lambda conn: apply_sqlite_migrations(conn, COMPONENT, MIGRATIONS))

    async def close(self) -> None:
        await self._db.close()

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` on the connection's thread; a file that cannot be used now raises ``RegistryUnavailable``
        (the driver's types stay inside this backend)."""
        return await self._db.run_or(_unavailable, fn)

    async def _write(self, actor: str, decide: Callable[[sqlite3.Connection, datetime], Change[R]]) -> R:
        """One change in one ``BEGIN IMMEDIATE`` transaction (see ``sluice.registry.changes``)."""
        check_actor(actor)

        def write(conn: sqlite3.Connection) -> Change[R]:
            now = datetime.now(UTC)
            change = decide(conn, now)
            _record(conn, change, actor, now)
            return change

        change = await self._run(lambda conn: transaction(conn, write))
        if change.action is not None:
            self._signal.notify()
        return change.result

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn`` in one read transaction: every statement sees the same state (WAL snapshot)."""

        def read(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN")
            try:
                return fn(conn)
            finally:
                conn.execute("COMMIT")

        return await self._run(read)

    # ---- models

    async def create_model(self, name: str, *, actor: str, description: str = "") -> Model:
        return await self._write(
            actor, lambda conn, now: plan_create_model(_model_state(conn, name), description, now)
        )

    async def get_model(self, name: str) -> Model:
        return (await self._read(lambda conn: _model_state(conn, name))).require_model()

    async def list_models(self) -> builtins.list[Model]:
        return [_CODEC.model(r) for r in await self._run(lambda c: c.execute(_SQL.select_models).fetchall())]

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
        return await self._write(
            actor,
            lambda conn, now: plan_add_version(
                _model_state(conn, model),
                version,
                artifact_uri=artifact_uri,
                weights_digest=weights_digest,
                build_config=build_config,
                now=now,
            ),
        )

    async def get_version(self, model: str, version: str) -> ModelVersion:
        return (await self._read(lambda conn: _model_state(conn, model))).require_version(version)

    async def list_versions(self, model: str) -> builtins.list[ModelVersion]:
        state = await self._read(lambda conn: _model_state(conn, model))
        state.require_model()
        return list(state.versions.values())

    async def set_version_state(
        self, model: str, version: str, state: VersionState, *, actor: str
    ) -> ModelVersion:
        return await self._write(
            actor, lambda conn, now: plan_version_state(_model_state(conn, model), version, state, now)
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
        return await self._write(
            actor, lambda conn, now: plan_route(_model_state(conn, model), weights_bp, version_states, now)
        )

    async def get_route(self, model: str) -> Route | None:
        state = await self._read(lambda conn: _model_state(conn, model))
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
        def decide(conn: sqlite3.Connection, now: datetime) -> Change[Replica]:
            return plan_register_replica(
                _model_state(conn, model),
                _replica(conn, replica_id),
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
        return await self._write(
            actor, lambda conn, now: plan_health(_require_replica(conn, replica_id), state, detail, now)
        )

    async def set_replica_pool(self, replica_id: str, pool: ReplicaPool, *, actor: str) -> Replica:
        return await self._write(
            actor, lambda conn, now: plan_replica_pool(_require_replica(conn, replica_id), pool, now)
        )

    async def get_replica(self, replica_id: str) -> Replica:
        return await self._run(lambda conn: _require_replica(conn, replica_id))

    async def list_replicas(self, model: str | None = None) -> builtins.list[Replica]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            if model is None:
                return conn.execute(_SQL.select_replicas).fetchall()
            return conn.execute(_SQL.select_replicas_of, (model,)).fetchall()

        return [_CODEC.replica(r) for r in await self._run(read)]

    async def remove_replica(self, replica_id: str, *, actor: str) -> None:
        await self._write(actor, lambda conn, now: plan_remove_replica(_require_replica(conn, replica_id)))

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
        def decide(conn: sqlite3.Connection, now: datetime) -> Change[Rollout]:
            return plan_start_rollout(
                _model_state(conn, model),
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
        def decide(conn: sqlite3.Connection, now: datetime) -> Change[Rollout]:
            return plan_move_rollout(
                _model_state(conn, model),
                move,
                reason=reason,
                now=now,
                expected_step_started_at=expected_step_started_at,
            )

        return await self._write(actor, decide)

    async def get_rollout(self, model: str) -> Rollout | None:
        state = await self._read(lambda conn: _model_state(conn, model))
        state.require_model()
        return state.rollout

    async def list_rollouts(self, *, active_only: bool = False) -> builtins.list[Rollout]:
        query = _SQL.select_active_rollouts if active_only else _SQL.select_rollouts
        return [_CODEC.rollout(r) for r in await self._run(lambda c: c.execute(query).fetchall())]

    # ---- generation, snapshot, audit, change feed

    async def generation(self) -> int:
        return await self._run(lambda conn: int(conn.execute(_SQL.select_generation).fetchone()[0]))

    async def snapshot(self) -> RegistrySnapshot:
        def read(conn: sqlite3.Connection) -> RegistrySnapshot:
            return RegistrySnapshot(
                generation=int(conn.execute(_SQL.select_generation).fetchone()[0]),
                models=tuple(_CODEC.model(r) for r in conn.execute(_SQL.select_models)),
                versions=tuple(_CODEC.version(r) for r in conn.execute(_SQL.select_versions)),
                replicas=tuple(_CODEC.replica(r) for r in conn.execute(_SQL.select_replicas)),
                routes=tuple(routes_from_rows(conn.execute(_SQL.select_routes).fetchall())),
            )

        return await self._read(read)

    async def audit(self, limit: int = 100, model: str | None = None) -> builtins.list[AuditEntry]:
        check_limit(limit)

        def read(conn: sqlite3.Connection) -> list[Any]:
            if model is None:
                return conn.execute(_SQL.select_audit, (limit,)).fetchall()
            return conn.execute(_SQL.select_audit_of, (model, limit)).fetchall()

        return [_CODEC.audit(r) for r in await self._run(read)]

    async def changes(self, after_generation: int, limit: int = 1000) -> builtins.list[AuditEntry]:
        check_limit(limit)
        rows = await self._run(lambda c: c.execute(_SQL.select_changes, (after_generation, limit)).fetchall())
        return [_CODEC.audit(r) for r in rows]

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        return await wait_for_generation(
            self.generation, self._signal, after_generation, timeout_s, lambda: self._poll_interval_s
        )
