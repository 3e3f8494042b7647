"""After a PostgreSQL outage ends (issue 26): the connections the pool held through the outage are dead,
and none of them may be taken for an outage of its own once the server is back. Driven through a TCP proxy
the test cuts and restores (PostgreSQL itself is never stopped)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway, wait_until
from log_lines import ShownLines, outage_levels, shown_log_lines
from pg import through_proxy
from tcp_proxy import ProxyThread

from gateway.metrics import GatewayMetrics
from gateway.routing.follower import RegistryFollower
from gateway.routing.router import Router
from gateway.routing.table import RoutingTable
from sluice.domain import Tenant
from sluice.logs import quiet_noisy_libraries
from sluice.stores.db import describe_pg_url
from sluice.stores.registry.postgres import PostgresRegistry
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
    via_proxy = through_proxy(database, pg_proxy.port)
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
        # the ledger's pool held several connections through the cut too: their usage is written at once
        # (psycopg_pool's own check slept 1 s, then 2 s, between dead connections: the meter's 2 s write
        # timeout took that for an outage)
        meter = gateway.gw.meter
        wait_until(lambda: meter.num_pending == 0, 5, "the usage written")
        assert meter.num_outages == 0 and meter.num_failed_attempts == 0
    finally:
        gateway.stop()


def _timed_get(gateway: RunningGateway, path: str, api_key: str = ACME_KEY) -> tuple[int, float, str]:
    """GET ``path``: its status, how long it took, and its error code (if any)."""
    with gateway.http() as http:
        began = time.monotonic()
        resp = http.get(path, headers={"Authorization": f"Bearer {api_key}"})
        took_s = time.monotonic() - began
    code = resp.json().get("error", {}).get("code", "") if resp.status_code >= 400 else ""
    return resp.status_code, took_s, code


def _outage_lines(shown: ShownLines) -> dict[str, list[str]]:
    return outage_levels((level, message) for level, _, message in shown.lines())


def test_after_an_outage_each_store_is_back_within_2_s_refuses_at_once_and_says_it_once_each_way(
    dev_checkpoint: Path, tmp_path: Path, database: str, pg_proxy: ProxyThread
) -> None:
    """The tenant store, the usage ledger and the batch store of one gateway through a cut of ~2 s:
    usage recorded meanwhile waits in the outbox; while a store is known down it refuses at once (never
    after a pool timeout); within 2 s of the restore each is back (a key created during the cut is
    served, the outbox is empty, batches are listed); the log says each outage once when it starts
    (WARNING) and once when it ends (INFO, with its length), by whichever part reports that store, and
    the pool's own per-attempt lines are counted, not logged."""
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    via_proxy = through_proxy(database, pg_proxy.port)
    with shown_log_lines() as shown:
        gateway = start_gateway(
            tmp_path, dev_checkpoint, engine=ScriptedFakeEngine(token_id, interval_s=0.005),
            database_url=via_proxy, dev_tenants=True, tenant_cache_ttl_s=0.2,
        )  # fmt: skip
        try:
            assert status(gateway, ACME_KEY) == 200  # the key read, the pools warm
            assert _timed_get(gateway, "/v1/batches")[0] == 200
            before = len(shown.records)
            pg_proxy.cut()
            assert [status(gateway, ACME_KEY) for _ in range(5)] == [200] * 5  # the last good view
            meter = gateway.gw.meter
            wait_until(lambda: meter.ledger_down and meter.num_pending == 5, 10, "the records pending")
            fresh_key = asyncio.run(_create_tenant(database, "created-in-the-cut"))  # PostgreSQL is up
            # every store known down by now or after one call: from then on each refusal is at once
            for path, code in (("/v1/usage", "usage_ledger_unavailable"), ("/v1/batches", "")):
                first, took_s, _ = _timed_get(gateway, path)
                assert first == 503 and took_s < 1.0, (path, first, took_s)  # not a pool timeout
                refused, took_s, got_code = _timed_get(gateway, path)
                assert refused == 503 and took_s < 0.5, (path, refused, took_s)
                assert got_code == code or not code, got_code
            assert status(gateway, fresh_key) == 503  # unknown to the cache, and the store is down
            time.sleep(1.0)  # retries and probes against the dead server
            pg_proxy.restore()
            restored = time.monotonic()
            wait_until(lambda: meter.num_pending == 0, 10, "the outbox written")
            wait_until(lambda: _timed_get(gateway, "/v1/batches")[0] == 200, 10, "batches listed")
            wait_until(lambda: status(gateway, fresh_key) == 200, 10, "the new key served")
            assert time.monotonic() - restored < 2.0
            assert _timed_get(gateway, "/v1/usage")[0] == 200
            with gateway.http() as http:
                metrics = http.get("/metrics").text
            assert 'sluice_quieted_log_lines_total{logger="psycopg.pool"}' in metrics
        finally:
            gateway.stop()
    during = ShownLines()
    during.records = shown.records[before:]
    assert _outage_lines(during) == {
        "tenant store": ["WARNING", "INFO"],
        "usage ledger": ["WARNING", "INFO"],
        "batch store: PostgreSQL at " + describe_pg_url(via_proxy): ["WARNING", "INFO"],
    }, during.lines()
    assert not [line for line in during.lines() if line[1].startswith("psycopg")], during.lines()
    ledger_back = next(m for _, _, m in during.lines() if m.startswith("usage ledger available again"))
    assert "5 records pending" in ledger_back or "4 records pending" in ledger_back, ledger_back


class _Tables:
    """Stands in for the router: the generations of the tables the follower applied."""

    def __init__(self) -> None:
        self.generations: list[int] = []

    async def apply(self, table: RoutingTable) -> None:
        self.generations.append(table.generation)


def test_the_registry_follower_routes_by_a_change_made_in_the_outage_within_2_s_of_its_end(
    database: str, pg_proxy: ProxyThread
) -> None:
    """A gateway's registry follower over the real PostgreSQL registry through the proxy: the registry
    changes while the gateway cannot reach it; within 2 s of the restore the gateway routes by the new
    generation; the outage is said by the registry's store once each way, not by each retry of the
    follower or of its LISTEN connection."""

    async def run(shown: ShownLines) -> tuple[float, int]:
        writer = PostgresRegistry(database)
        followed = PostgresRegistry(through_proxy(database, pg_proxy.port))
        await writer.open()
        await followed.open()
        tables = _Tables()
        follower = RegistryFollower(followed, cast(Router, tables), GatewayMetrics(), poll_interval_s=5.0)
        try:
            await follower.start()
            await writer.create_model("before-the-cut", actor="test")
            generation = await writer.generation()
            await _until(lambda: follower.generation == generation, "the change before the cut")
            before = len(shown.records)
            await asyncio.to_thread(pg_proxy.cut)
            await writer.create_model("during-the-cut", actor="test")  # PostgreSQL itself is up
            changed = await writer.generation()
            await asyncio.sleep(1.5)  # the follower's retries, the LISTEN connection's
            assert follower.generation == generation  # routing by what it read last
            await asyncio.to_thread(pg_proxy.restore)
            restored = time.monotonic()
            await _until(lambda: follower.generation == changed, "the change made during the cut")
            return time.monotonic() - restored, before
        finally:
            await follower.close()
            await followed.close()
            await writer.close()

    quiet_noisy_libraries()  # as each service does at start (sluice.logs)
    with shown_log_lines() as shown:
        took_s, before = asyncio.run(run(shown))
    assert took_s < 2.0
    during = ShownLines()
    during.records = shown.records[before:]
    assert list(_outage_lines(during).values()) == [["WARNING", "INFO"]], during.lines()
    # the store's two lines, then the follower's "routing by registry generation N"
    expected = ["sluice.stores.db", "sluice.stores.db", "gateway.routing.follower"]
    assert [name for _, name, _ in during.lines()] == expected, during.lines()


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
