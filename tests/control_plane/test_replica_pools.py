"""Replica pools through the admin API (the app's real lifespan, a fresh SQLite registry, real
tritonservers): an external replica registered into the long-prompt pool, a local one started warm and
promoted to general in one registry write, each audited; bad pools refused with a 400, unknown replicas
with a 404; and the CLI's table shows the pool."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient
from test_local_replicas import MODEL, error, register_versions, replicas, service, wait_state

from control_plane.cli.replicas import HEADERS, print_replicas
from replicas.launcher import TritonServer
from sluice.settings import Settings, load_settings
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.admin_tokens.store import SqliteAdminTokenStore
from sluice.stores.registry.base import ChangeAction
from sluice.stores.registry.sqlite import SqliteRegistry


@pytest.fixture
def settings(clean_env: Path) -> Settings:
    return load_settings()


@pytest.fixture
def client(settings: Settings, dev_checkpoint: Path) -> Iterator[TestClient[Any]]:
    async def token() -> str:
        store = SqliteAdminTokenStore(settings.sqlite_path)
        await store.open()
        try:
            return await store.create("release", Role.RELEASE_MANAGER)
        finally:
            await store.close()

    register_versions(settings, dev_checkpoint, **{"1": dev_checkpoint.as_uri()})
    with service(settings, asyncio.run(token())) as client:
        yield client


def pool_changes(settings: Settings) -> list[tuple[str, str, str]]:
    """(subject, pool before, pool after) of every ``replica.pool`` audit row, oldest first."""

    async def read() -> list[tuple[str, str, str]]:
        registry = SqliteRegistry(settings.sqlite_path)
        await registry.open()
        try:
            rows = await registry.audit(limit=1000)
        finally:
            await registry.close()
        return [
            (e.subject, e.before["pool"], e.after["pool"])
            for e in reversed(rows)
            if e.action == ChangeAction.REPLICA_POOL
        ]

    return asyncio.run(read())


def test_replicas_join_a_pool_and_a_warm_one_is_promoted(
    client: TestClient[Any], settings: Settings, replica: TritonServer, capsys: pytest.CaptureFixture[str]
) -> None:
    body = {"endpoint": replica.grpc_url, "model": MODEL, "version": "1", "pool": "long-prompt"}
    resp = client.put("/admin/v1/replicas/ext-long", json=body)
    assert resp.status_code == 200, resp.text
    assert (resp.json()["pool"], resp.json()["state"]) == ("long-prompt", "ready")
    assert "pool" in error(client.put("/admin/v1/replicas/ext-2", json={**body, "pool": "huge"}), 400)
    assert "ext-2" not in replicas(client)

    started = client.post("/admin/v1/replicas", json={"model": MODEL, "version": "1", "pool": "warm"})
    assert started.status_code == 202, started.text
    (warm,) = started.json()["replicas"]
    assert (warm["pool"], warm["state"]) == ("warm", "starting")
    ready = wait_state(client, warm["replica_id"], "ready")
    assert ready["pool"] == "warm"  # loaded and verified, still routed nothing

    promote = f"/admin/v1/replicas/{warm['replica_id']}/pool"
    promoted = client.post(promote, json={"pool": "general"})
    assert promoted.status_code == 200, promoted.text
    assert (promoted.json()["pool"], promoted.json()["state"]) == ("general", "ready")
    assert replicas(client)[warm["replica_id"]]["pool"] == "general"
    assert pool_changes(settings) == [
        ("replica ext-long", "general", "long-prompt"),
        (f"replica {warm['replica_id']}", "general", "warm"),
        (f"replica {warm['replica_id']}", "warm", "general"),
    ]
    assert "pool" in error(client.post(promote, json={"pool": "cold"}), 400)
    assert "no replica" in error(client.post("/admin/v1/replicas/nope/pool", json={"pool": "general"}), 404)

    print_replicas(list(replicas(client).values()))
    header, *rows = capsys.readouterr().out.splitlines()
    assert "POOL" in header and HEADERS.index("POOL") == HEADERS.index("LOCAL") + 1
    assert {row.split()[0]: row.split() for row in rows}["ext-long"][:4] == ["ext-long", MODEL, "1", "ready"]
    assert sorted(r for row in rows for r in row.split() if r in ("general", "long-prompt")) == [
        "general",
        "long-prompt",
    ]
