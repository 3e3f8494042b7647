"""After a PostgreSQL outage ends (issue 26): the connections the pool held through the outage are dead,
and none of them may be taken for an outage of its own once the server is back. Driven through a TCP proxy
the test cuts and restores (PostgreSQL itself is never stopped)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fakes import ScriptedFakeEngine
from harness import MODEL, RunningGateway, start_gateway
from tcp_proxy import ProxyThread

from sluice.domain import Tenant
from sluice.stores.tenants.store import PostgresTenantStore
from sluice.text import TextCodec


def status(gateway: RunningGateway, api_key: str) -> int:
    with gateway.http() as http:
        resp = http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 2},
            headers={"Authorization": f"Bearer {api_key}"},
        )
    return resp.status_code


async def _create_tenant(url: str, tenant_id: str) -> str:
    store = PostgresTenantStore(url, pool_max_size=1)
    await store.open()
    try:
        return await store.create(Tenant(tenant_id, tenant_id, frozenset({MODEL})))
    finally:
        await store.close()


def test_no_false_outage_from_connections_that_died_during_one(
    dev_checkpoint: Path, tmp_path: Path, database: str, pg_proxy: ProxyThread
) -> None:
    """The reproduction from the issue: the pool holds several connections; PostgreSQL is cut and
    restored; a tenant created after the restore is served at once (today's pool handed out each dead
    connection once more, and the first lookup to draw one declared a new outage: 503 for seconds)."""
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    server, _, dbname = database.rpartition("/")
    via_proxy = f"{server.rpartition('@')[0]}@127.0.0.1:{pg_proxy.port}/{dbname}"
    gateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=ScriptedFakeEngine(token_id, interval_s=0.005),
        database_url=via_proxy,
        dev_tenants=True,
        tenant_cache_ttl_s=0.2,
    )
    try:
        keys = [asyncio.run(_create_tenant(database, f"warm-{i}")) for i in range(6)]
        with ThreadPoolExecutor(max_workers=6) as pool:  # lookups at once: the pool grows past one
            assert list(pool.map(lambda key: status(gateway, key), keys)) == [200] * 6
        pg_proxy.cut()
        time.sleep(0.5)
        pg_proxy.restore()
        time.sleep(0.5)
        fresh = [asyncio.run(_create_tenant(database, f"fresh-{i}")) for i in range(6)]
        with ThreadPoolExecutor(max_workers=6) as pool:
            assert list(pool.map(lambda key: status(gateway, key), fresh)) == [200] * 6
        with gateway.http() as http:
            assert "\nsluice_gateway_tenant_store_down 0.0" in http.get("/metrics").text
    finally:
        gateway.stop()
