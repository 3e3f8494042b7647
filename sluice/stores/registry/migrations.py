"""The registry's schema, as numbered migrations applied at ``open()`` (see ``sluice.stores.db``), and how its
values are laid out in rows (the same for both databases; JSON is TEXT on SQLite, JSONB on PostgreSQL).

``registry_generation`` holds one row: the generation. Every change updates it first, so on PostgreSQL
the row lock orders writers and they commit in generation order; ``registry_audit`` is keyed by the
generation, so two changes can never share one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.stores.db import Migration
from sluice.stores.registry.base import (
    AuditEntry,
    ChangeAction,
    Model,
    ModelVersion,
    Replica,
    ReplicaPool,
    ReplicaState,
    Route,
    RouteEntry,
    VersionState,
)
from sluice.stores.registry.rollouts import Rollout, RolloutGuard, RolloutState
from sluice.stores.transactions import Codecs

COMPONENT = "registry"


def _in(states: Sequence[str]) -> str:
    return ", ".join(f"'{s}'" for s in states)


_DDL = f"""
    CREATE TABLE registry_generation (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        generation BIGINT NOT NULL CHECK (generation >= 0)
    );
    INSERT INTO registry_generation (id, generation) VALUES (1, 0);
    CREATE TABLE registry_models (
        name TEXT PRIMARY KEY,
        description TEXT NOT NULL,
        created_at {{ts}} NOT NULL
    );
    CREATE TABLE registry_versions (
        model TEXT NOT NULL REFERENCES registry_models (name),
        version TEXT NOT NULL,
        artifact_uri TEXT NOT NULL,
        weights_digest TEXT NOT NULL,
        build_config {{json}} NOT NULL,
        state TEXT NOT NULL CHECK (state IN ({_in(list(VersionState))})),
        created_at {{ts}} NOT NULL,
        updated_at {{ts}} NOT NULL,
        PRIMARY KEY (model, version)
    );
    CREATE TABLE registry_routes (
        model TEXT NOT NULL REFERENCES registry_models (name),
        version TEXT NOT NULL,
        weight_bp INTEGER NOT NULL CHECK (weight_bp BETWEEN 0 AND 10000),
        PRIMARY KEY (model, version),
        FOREIGN KEY (model, version) REFERENCES registry_versions (model, version)
    );
    CREATE TABLE registry_replicas (
        replica_id TEXT PRIMARY KEY,
        endpoint TEXT NOT NULL,
        model TEXT NOT NULL,
        version TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ({_in(list(ReplicaState))})),
        health_detail TEXT NOT NULL,
        last_health_at {{ts}},
        registered_at {{ts}} NOT NULL,
        updated_at {{ts}} NOT NULL,
        FOREIGN KEY (model, version) REFERENCES registry_versions (model, version)
    );
    CREATE INDEX registry_replicas_model ON registry_replicas (model, version);
    CREATE TABLE registry_audit (
        generation BIGINT PRIMARY KEY,
        at {{ts}} NOT NULL,
        actor TEXT NOT NULL,
        action TEXT NOT NULL,
        model TEXT NOT NULL,
        subject TEXT NOT NULL,
        before {{json}},
        after {{json}}
    );
    CREATE INDEX registry_audit_model ON registry_audit (model, generation)
"""

# One row per model: its latest rollout (sluice.stores.registry.rollouts); the audit log keeps every move.
_ROLLOUTS_DDL = f"""
    CREATE TABLE registry_rollouts (
        model TEXT PRIMARY KEY REFERENCES registry_models (name),
        stable_version TEXT NOT NULL,
        canary_version TEXT NOT NULL,
        steps_bp {{json}} NOT NULL,
        step_index INTEGER NOT NULL CHECK (step_index >= 0),
        state TEXT NOT NULL CHECK (state IN ({_in(list(RolloutState))})),
        guard {{json}},
        started_by TEXT NOT NULL,
        started_at {{ts}} NOT NULL,
        step_started_at {{ts}} NOT NULL,
        updated_at {{ts}} NOT NULL,
        finished_at {{ts}},
        reason TEXT NOT NULL,
        FOREIGN KEY (model, stable_version) REFERENCES registry_versions (model, version),
        FOREIGN KEY (model, canary_version) REFERENCES registry_versions (model, version)
    )
"""

# Where a replica's load is read (its Triton metrics URL); "" for the replicas registered before it.
_REPLICA_METRICS_URL_DDL = "ALTER TABLE registry_replicas ADD COLUMN metrics_url TEXT NOT NULL DEFAULT ''"

# Which requests a replica takes (ReplicaPool); the replicas registered before it are general.
_REPLICA_POOL_DDL = (
    "ALTER TABLE registry_replicas ADD COLUMN pool TEXT NOT NULL DEFAULT 'general'"
    f" CHECK (pool IN ({_in(list(ReplicaPool))}))"
)

MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        name="registry: generation, models, versions, routes, replicas, audit",
        sqlite=_DDL.format(ts="TEXT", json="TEXT"),
        postgres=_DDL.format(ts="TIMESTAMPTZ", json="JSONB"),
    ),
    Migration(
        version=2,
        name="registry: rollouts (each model's latest)",
        sqlite=_ROLLOUTS_DDL.format(ts="TEXT", json="TEXT"),
        postgres=_ROLLOUTS_DDL.format(ts="TIMESTAMPTZ", json="JSONB"),
    ),
    Migration(
        version=3,
        name="registry: each replica's metrics URL",
        sqlite=_REPLICA_METRICS_URL_DDL,
        postgres=_REPLICA_METRICS_URL_DDL,
    ),
    Migration(
        version=4,
        name="registry: each replica's pool (general, long-prompt, warm)",
        sqlite=_REPLICA_POOL_DDL,
        postgres=_REPLICA_POOL_DDL,
    ),
]

MODEL_COLUMNS = ("name", "description", "created_at")
VERSION_COLUMNS = (
    "model",
    "version",
    "artifact_uri",
    "weights_digest",
    "build_config",
    "state",
    "created_at",
    "updated_at",
)
REPLICA_COLUMNS = (
    "replica_id",
    "endpoint",
    "model",
    "version",
    "state",
    "health_detail",
    "last_health_at",
    "registered_at",
    "updated_at",
    "metrics_url",
    "pool",
)
ROUTE_COLUMNS = ("model", "version", "weight_bp")
AUDIT_COLUMNS = ("generation", "at", "actor", "action", "model", "subject", "before", "after")
ROLLOUT_COLUMNS = (
    "model",
    "stable_version",
    "canary_version",
    "steps_bp",
    "step_index",
    "state",
    "guard",
    "started_by",
    "started_at",
    "step_started_at",
    "updated_at",
    "finished_at",
    "reason",
)


class RowCodec:
    """Rows to our values and back, in one database's codecs (``Tx.codecs``): timestamps as aware UTC
    datetimes, stored JSON as Python values."""

    def __init__(self, codecs: Codecs) -> None:
        self.to_utc = codecs.from_db_time
        self.from_db_json = codecs.from_db_json
        self.to_db_json = codecs.to_db_json
        self.to_db_time = codecs.to_db_time

    def model(self, row: Sequence[Any]) -> Model:
        name, description, created_at = row
        return Model(name, description, self.to_utc(created_at))

    def model_row(self, m: Model) -> tuple[Any, ...]:
        return (m.name, m.description, self.to_db_time(m.created_at))

    def version(self, row: Sequence[Any]) -> ModelVersion:
        model, version, uri, digest, config, state, created_at, updated_at = row
        return ModelVersion(
            model=model,
            version=version,
            artifact_uri=uri,
            weights_digest=digest,
            build_config=self.from_db_json(config),
            state=VersionState(state),
            created_at=self.to_utc(created_at),
            updated_at=self.to_utc(updated_at),
        )

    def version_row(self, v: ModelVersion) -> tuple[Any, ...]:
        return (
            v.model,
            v.version,
            v.artifact_uri,
            v.weights_digest,
            self.to_db_json(dict(v.build_config)),
            str(v.state),
            self.to_db_time(v.created_at),
            self.to_db_time(v.updated_at),
        )

    def replica(self, row: Sequence[Any]) -> Replica:
        (replica_id, endpoint, model, version, state, detail, health_at, registered_at, updated_at, metrics,
         pool) = row  # fmt: skip
        return Replica(
            replica_id=replica_id,
            endpoint=endpoint,
            model=model,
            version=version,
            state=ReplicaState(state),
            health_detail=detail,
            last_health_at=None if health_at is None else self.to_utc(health_at),
            registered_at=self.to_utc(registered_at),
            updated_at=self.to_utc(updated_at),
            metrics_url=metrics,
            pool=ReplicaPool(pool),
        )

    def replica_row(self, r: Replica) -> tuple[Any, ...]:
        return (
            r.replica_id,
            r.endpoint,
            r.model,
            r.version,
            str(r.state),
            r.health_detail,
            None if r.last_health_at is None else self.to_db_time(r.last_health_at),
            self.to_db_time(r.registered_at),
            self.to_db_time(r.updated_at),
            r.metrics_url,
            str(r.pool),
        )

    def audit(self, row: Sequence[Any]) -> AuditEntry:
        generation, at, actor, action, model, subject, before, after = row
        return AuditEntry(
            generation=int(generation),
            at=self.to_utc(at),
            actor=actor,
            action=ChangeAction(action),
            model=model,
            subject=subject,
            before=None if before is None else self.from_db_json(before),
            after=None if after is None else self.from_db_json(after),
        )

    def audit_row(self, e: AuditEntry) -> tuple[Any, ...]:
        return (
            e.generation,
            self.to_db_time(e.at),
            e.actor,
            str(e.action),
            e.model,
            e.subject,
            None if e.before is None else self.to_db_json(e.before),
            None if e.after is None else self.to_db_json(e.after),
        )

    def rollout(self, row: Sequence[Any]) -> Rollout:
        (
            model,
            stable,
            canary,
            steps,
            index,
            state,
            guard,
            by,
            started,
            step_started,
            updated,
            finished,
            reason,
        ) = row
        return Rollout(
            model=model,
            stable_version=stable,
            canary_version=canary,
            steps_bp=tuple(int(s) for s in self.from_db_json(steps)),
            step_index=int(index),
            state=RolloutState(state),
            guard=None if guard is None else RolloutGuard.from_json(self.from_db_json(guard)),
            started_by=by,
            started_at=self.to_utc(started),
            step_started_at=self.to_utc(step_started),
            updated_at=self.to_utc(updated),
            finished_at=None if finished is None else self.to_utc(finished),
            reason=reason,
        )

    def rollout_row(self, r: Rollout) -> tuple[Any, ...]:
        return (
            r.model,
            r.stable_version,
            r.canary_version,
            self.to_db_json(list(r.steps_bp)),
            r.step_index,
            str(r.state),
            None if r.guard is None else self.to_db_json(r.guard.as_json()),
            r.started_by,
            self.to_db_time(r.started_at),
            self.to_db_time(r.step_started_at),
            self.to_db_time(r.updated_at),
            None if r.finished_at is None else self.to_db_time(r.finished_at),
            r.reason,
        )


def routes_from_rows(rows: Sequence[Sequence[Any]]) -> list[Route]:
    """``ROUTE_COLUMNS`` rows ordered by (model, version) as one ``Route`` per model."""
    entries: dict[str, list[RouteEntry]] = {}
    for model, version, weight_bp in rows:
        entries.setdefault(model, []).append(RouteEntry(version, int(weight_bp)))
    return [Route(model, tuple(e)) for model, e in entries.items()]
