"""After a PostgreSQL outage ends (issue 26): the connections the pool held through the outage are dead,
and none of them may be taken for an outage of its own once the server is back. Driven through a TCP proxy
the test cuts and restores (PostgreSQL itself is never stopped)."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway, wait_until
from pg import through_proxy
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
    finally:
        gateway.stop()


class _Lines(logging.Handler):
    """The records of the loggers it is added to (its own handler: the server may replace pytest's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_ledger_outage_ends_within_a_second_or_two_and_is_said_once_each_way(
    dev_checkpoint: Path, tmp_path: Path, database: str, pg_proxy: ProxyThread
) -> None:
    """Usage recorded during a cut waits in the outbox; /v1/usage is refused at once while the ledger is
    known down (never after a pool timeout); after the restore the outbox empties within 2 s; the log says
    the outage once when it starts (WARNING) and once when it ends (INFO, with its length and what is
    pending), and the pool's own per-attempt lines are counted, not logged."""
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    via_proxy = through_proxy(database, pg_proxy.port)
    lines = _Lines()
    watched = [logging.getLogger(name) for name in ("gateway.metering.pipeline", "psycopg.pool")]
    levels = [logger.level for logger in watched]
    for logger in watched:
        logger.addHandler(lines)
        logger.setLevel(logging.INFO)  # as the service runs (sluice.logs.configure_logging)
    gateway = start_gateway(
        tmp_path, dev_checkpoint, engine=ScriptedFakeEngine(token_id, interval_s=0.005),
        database_url=via_proxy, dev_tenants=True, tenant_cache_ttl_s=3600.0,
    )  # fmt: skip
    try:
        assert status(gateway, ACME_KEY) == 200  # the key cached, the pool warm
        pg_proxy.cut()
        assert [status(gateway, ACME_KEY) for _ in range(5)] == [200] * 5  # usage waits in the outbox
        meter = gateway.gw.meter
        wait_until(lambda: meter.ledger_down and meter.num_pending == 5, 10, "the records pending")
        with gateway.http() as http:
            began = time.monotonic()
            refused = http.get("/v1/usage", headers={"Authorization": f"Bearer {ACME_KEY}"})
            assert refused.status_code == 503 and time.monotonic() - began < 0.5
        assert refused.json()["error"]["code"] == "usage_ledger_unavailable"
        time.sleep(1.0)  # a few retries against the dead server
        pg_proxy.restore()
        restored = time.monotonic()
        wait_until(lambda: meter.num_pending == 0, 10, "the outbox written")
        assert time.monotonic() - restored < 2.0
        with gateway.http() as http:
            assert http.get("/v1/usage", headers={"Authorization": f"Bearer {ACME_KEY}"}).status_code == 200
            metrics = http.get("/metrics").text
        assert 'sluice_quieted_log_lines_total{logger="psycopg.pool"}' in metrics
    finally:
        gateway.stop()
        for logger, level in zip(watched, levels, strict=True):
            logger.removeHandler(lines)
            logger.setLevel(level)
    shown = [r for r in lines.records if r.levelno >= logging.INFO and all(f.filter(r) for f in r_filters(r))]
    assert [(r.levelname, r.name) for r in shown] == [
        ("WARNING", "gateway.metering.pipeline"),
        ("INFO", "gateway.metering.pipeline"),
    ], [r.getMessage() for r in shown]
    assert "unavailable" in shown[0].getMessage() and "available again after" in shown[1].getMessage()


def r_filters(record: logging.LogRecord) -> list[logging.Filter]:
    """The filters of the logger that made ``record`` (a handler on it sees records its filters drop)."""
    return [f for f in logging.getLogger(record.name).filters if isinstance(f, logging.Filter)]
