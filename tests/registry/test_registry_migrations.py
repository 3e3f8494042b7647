"""The registry's schema migrations over existing data, on every backend: a registry written by an older
schema opens with the rows it had, and what a later migration added reads as its documented default."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from registry_backends import RegistryBackend

from sluice.stores.db import apply_pg_migrations, apply_sqlite_migrations, open_pg_pool
from sluice.stores.registry.base import ReplicaPool, ReplicaState
from sluice.stores.registry.migrations import COMPONENT, MIGRATIONS

pytestmark = pytest.mark.anyio

# A model, a version and a replica as schema version 2 stored them (before replicas had a metrics URL).
_AT = "2026-01-02T03:04:05.000000+00:00"
_OLD_ROWS = (
    ("INSERT INTO registry_models (name, description, created_at) VALUES ({p}, {p}, {p})", ("tiny", "", _AT)),
    (
        "INSERT INTO registry_versions (model, version, artifact_uri, weights_digest, build_config, state,"
        " created_at, updated_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
        ("tiny", "1", "s3://m/tiny/1", "sha256:" + "ab" * 32, "{}", "serving", _AT, _AT),
    ),
    (
        "INSERT INTO registry_replicas (replica_id, endpoint, model, version, state, health_detail,"
        " last_health_at, registered_at, updated_at) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p})",
        ("r-old", "10.0.0.7:8001", "tiny", "1", "ready", "", None, _AT, _AT),
    ),
)
_BEFORE_METRICS_URL = [m for m in MIGRATIONS if m.version <= 2]


async def _write_schema_2(backend: RegistryBackend, sqlite_path: Path) -> None:
    if backend.database_url is None:
        conn = sqlite3.connect(sqlite_path, isolation_level=None)
        try:
            apply_sqlite_migrations(conn, COMPONENT, _BEFORE_METRICS_URL)
            for text, params in _OLD_ROWS:
                conn.execute(text.format(p="?"), params)
        finally:
            conn.close()
        return
    pool = await open_pg_pool(backend.database_url, max_size=1, name="registry-schema-2")
    try:
        await apply_pg_migrations(pool, COMPONENT, _BEFORE_METRICS_URL)
        async with pool.connection() as pg:
            for text, params in _OLD_ROWS:
                await pg.execute(text.format(p="%s").encode(), params)
    finally:
        await pool.close()


async def test_replicas_registered_before_metrics_urls_have_none(
    backend: RegistryBackend, tmp_path: Path
) -> None:
    await _write_schema_2(backend, tmp_path / "sluice.db")
    async with backend.opened() as registry:
        old = await registry.get_replica("r-old")
        assert (old.endpoint, old.state, old.metrics_url) == ("10.0.0.7:8001", ReplicaState.READY, "")
        assert (await registry.snapshot()).replicas == (old,)
        # And a registration now stores one beside it.
        await registry.register_replica(
            "r-new", endpoint="10.0.0.8:8001", model="tiny", version="1", actor="t",
            metrics_url="http://10.0.0.8:8002/metrics",
        )  # fmt: skip
        assert {r.replica_id: r.metrics_url for r in await registry.list_replicas()} == {
            "r-new": "http://10.0.0.8:8002/metrics",
            "r-old": "",
        }


async def test_replicas_registered_before_pools_are_general(backend: RegistryBackend, tmp_path: Path) -> None:
    await _write_schema_2(backend, tmp_path / "sluice.db")
    async with backend.opened() as registry:
        old = await registry.get_replica("r-old")
        assert (old.state, old.pool) == (ReplicaState.READY, ReplicaPool.GENERAL)
        await registry.register_replica(
            "r-long",
            endpoint="10.0.0.9:8001",
            model="tiny",
            version="1",
            actor="t",
            pool=ReplicaPool.LONG_PROMPT,
        )
        assert {r.replica_id: r.pool for r in (await registry.snapshot()).replicas} == {
            "r-long": ReplicaPool.LONG_PROMPT,
            "r-old": ReplicaPool.GENERAL,
        }
