"""The registry's SQL, written once for both databases (``?`` placeholders: ``sluice.stores.transactions``).
Built from constant table and column names, never from input."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.stores.registry.migrations import (
    AUDIT_COLUMNS,
    MODEL_COLUMNS,
    REPLICA_COLUMNS,
    ROLLOUT_COLUMNS,
    ROUTE_COLUMNS,
    VERSION_COLUMNS,
)
from sluice.stores.registry.rollouts import ACTIVE_ROLLOUT_STATES


def _insert(table: str, columns: tuple[str, ...], key: tuple[str, ...] = ()) -> str:
    text = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['?'] * len(columns))})"
    if key:
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
        text += f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}"
    return text


def _select(table: str, columns: tuple[str, ...]) -> str:
    return f"SELECT {', '.join(columns)} FROM {table}"


@dataclass(frozen=True)
class Statements:
    insert_model: str
    upsert_version: str
    upsert_replica: str
    insert_route_entry: str
    delete_route: str
    delete_replica: str
    insert_audit: str
    bump_generation: str  # returns the new generation
    select_generation: str
    lock_generation: str  # PostgreSQL only: orders writers (SQLite's writes take BEGIN IMMEDIATE instead)
    notify: str  # PostgreSQL only: (channel, generation), delivered on commit
    select_model: str
    select_models: str
    select_versions_of: str
    select_versions: str
    select_route_of: str
    select_routes: str
    select_replica: str
    select_replicas_of: str
    select_replicas: str
    select_audit: str  # newest first, limit
    select_audit_of: str  # one model's, newest first, limit
    select_changes: str  # after a generation, oldest first, limit
    upsert_rollout: str
    select_rollout: str  # one model's
    select_rollouts: str  # by model
    select_active_rollouts: str  # running or paused, by model


def _statements() -> Statements:
    models = _select("registry_models", MODEL_COLUMNS)
    versions = _select("registry_versions", VERSION_COLUMNS)
    routes = _select("registry_routes", ROUTE_COLUMNS)
    replicas = _select("registry_replicas", REPLICA_COLUMNS)
    audit = _select("registry_audit", AUDIT_COLUMNS)
    rollouts = _select("registry_rollouts", ROLLOUT_COLUMNS)
    active = ", ".join(f"'{s}'" for s in sorted(ACTIVE_ROLLOUT_STATES))
    return Statements(
        insert_model=_insert("registry_models", MODEL_COLUMNS),
        upsert_version=_insert("registry_versions", VERSION_COLUMNS, ("model", "version")),
        upsert_replica=_insert("registry_replicas", REPLICA_COLUMNS, ("replica_id",)),
        insert_route_entry=_insert("registry_routes", ROUTE_COLUMNS),
        delete_route="DELETE FROM registry_routes WHERE model = ?",
        delete_replica="DELETE FROM registry_replicas WHERE replica_id = ?",
        insert_audit=_insert("registry_audit", AUDIT_COLUMNS),
        bump_generation=(
            "UPDATE registry_generation SET generation = generation + 1 WHERE id = 1 RETURNING generation"
        ),
        select_generation="SELECT generation FROM registry_generation WHERE id = 1",
        lock_generation="SELECT generation FROM registry_generation WHERE id = 1 FOR UPDATE",
        notify="SELECT pg_notify(?, ?)",
        select_model=f"{models} WHERE name = ?",
        select_models=f"{models} ORDER BY name",
        select_versions_of=f"{versions} WHERE model = ? ORDER BY version",
        select_versions=f"{versions} ORDER BY model, version",
        select_route_of=f"{routes} WHERE model = ? ORDER BY version",
        select_routes=f"{routes} ORDER BY model, version",
        select_replica=f"{replicas} WHERE replica_id = ?",
        select_replicas_of=f"{replicas} WHERE model = ? ORDER BY replica_id",
        select_replicas=f"{replicas} ORDER BY replica_id",
        select_audit=f"{audit} ORDER BY generation DESC LIMIT ?",
        select_audit_of=f"{audit} WHERE model = ? ORDER BY generation DESC LIMIT ?",
        select_changes=f"{audit} WHERE generation > ? ORDER BY generation LIMIT ?",
        upsert_rollout=_insert("registry_rollouts", ROLLOUT_COLUMNS, ("model",)),
        select_rollout=f"{rollouts} WHERE model = ?",
        select_rollouts=f"{rollouts} ORDER BY model",
        select_active_rollouts=f"{rollouts} WHERE state IN ({active}) ORDER BY model",
    )


SQL = _statements()
