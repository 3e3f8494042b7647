"""The registry's SQL, written once for both dialects: they differ here only in the placeholder (``?`` for
SQLite, ``%s`` for PostgreSQL). Built from constant table and column names, never from input."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.registry.migrations import (
    AUDIT_COLUMNS,
    MODEL_COLUMNS,
    REPLICA_COLUMNS,
    ROLLOUT_COLUMNS,
    ROUTE_COLUMNS,
    VERSION_COLUMNS,
)
from sluice.registry.rollouts import ACTIVE_ROLLOUT_STATES


def _insert(table: str, columns: tuple[str, ...], p: str, key: tuple[str, ...] = ()) -> str:
    text = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join([p] * len(columns))})"
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
    select_model: str
    select_models: str
    select_version: str
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


def statements(p: str) -> Statements:
    """Every statement with placeholder ``p``."""
    models = _select("registry_models", MODEL_COLUMNS)
    versions = _select("registry_versions", VERSION_COLUMNS)
    routes = _select("registry_routes", ROUTE_COLUMNS)
    replicas = _select("registry_replicas", REPLICA_COLUMNS)
    audit = _select("registry_audit", AUDIT_COLUMNS)
    rollouts = _select("registry_rollouts", ROLLOUT_COLUMNS)
    active = ", ".join(f"'{s}'" for s in sorted(ACTIVE_ROLLOUT_STATES))
    return Statements(
        insert_model=_insert("registry_models", MODEL_COLUMNS, p),
        upsert_version=_insert("registry_versions", VERSION_COLUMNS, p, ("model", "version")),
        upsert_replica=_insert("registry_replicas", REPLICA_COLUMNS, p, ("replica_id",)),
        insert_route_entry=_insert("registry_routes", ROUTE_COLUMNS, p),
        delete_route=f"DELETE FROM registry_routes WHERE model = {p}",
        delete_replica=f"DELETE FROM registry_replicas WHERE replica_id = {p}",
        insert_audit=_insert("registry_audit", AUDIT_COLUMNS, p),
        bump_generation=(
            "UPDATE registry_generation SET generation = generation + 1 WHERE id = 1 RETURNING generation"
        ),
        select_generation="SELECT generation FROM registry_generation WHERE id = 1",
        select_model=f"{models} WHERE name = {p}",
        select_models=f"{models} ORDER BY name",
        select_version=f"{versions} WHERE model = {p} AND version = {p}",
        select_versions_of=f"{versions} WHERE model = {p} ORDER BY version",
        select_versions=f"{versions} ORDER BY model, version",
        select_route_of=f"{routes} WHERE model = {p} ORDER BY version",
        select_routes=f"{routes} ORDER BY model, version",
        select_replica=f"{replicas} WHERE replica_id = {p}",
        select_replicas_of=f"{replicas} WHERE model = {p} ORDER BY replica_id",
        select_replicas=f"{replicas} ORDER BY replica_id",
        select_audit=f"{audit} ORDER BY generation DESC LIMIT {p}",
        select_audit_of=f"{audit} WHERE model = {p} ORDER BY generation DESC LIMIT {p}",
        select_changes=f"{audit} WHERE generation > {p} ORDER BY generation LIMIT {p}",
        upsert_rollout=_insert("registry_rollouts", ROLLOUT_COLUMNS, p, ("model",)),
        select_rollout=f"{rollouts} WHERE model = {p}",
        select_rollouts=f"{rollouts} ORDER BY model",
        select_active_rollouts=f"{rollouts} WHERE state IN ({active}) ORDER BY model",
    )
