"""A real gateway whose tenant store (PostgreSQL) goes away mid-run, through a TCP proxy that is cut and
restored: known keys keep streaming from the last good view (until the stale limit), unknown keys get
503 tenant_store_unavailable with Retry-After, a flood of random keys makes a bounded number of store
queries, and everything recovers when the store comes back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway, wait_until
from log_lines import ShownLines, shown_log_lines
from pg import through_proxy
from tcp_proxy import ProxyThread

from sluice.text import TextCodec

NUM_FLOOD = 200
STALE_MAX_S = 6.0  # room for the flood on a loaded 2-core machine (it took ~2 s with the suite beside it)
PROBE_INTERVAL_S = 0.5


@pytest.fixture
def outage_log() -> Iterator[ShownLines]:
    """What the log shows meanwhile (its own handler: the server's logging set-up may replace pytest's)."""
    with shown_log_lines() as lines:
        yield lines


def stream(gateway: RunningGateway, api_key: str) -> int:
    """A streamed completion read to the end; its HTTP status (200: every chunk and [DONE] arrived)."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 8, "stream": True}
    headers = {"Authorization": f"Bearer {api_key}"}
    with gateway.http() as http, http.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        if resp.status_code != 200:
            return resp.status_code
        events = [line[len("data: ") :] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    return 200


def refused_unavailable(gateway: RunningGateway, api_key: str) -> None:
    """The key gets 503 tenant_store_unavailable with Retry-After."""
    with gateway.http() as http:
        resp = http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 2},
            headers={"Authorization": f"Bearer {api_key}"},
        )
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "tenant_store_unavailable"
    assert 1 <= int(resp.headers["Retry-After"]) <= 2


def flood(gateway: RunningGateway, keys: list[str]) -> list[int]:
    """One completion per key, all at once (16 at a time over one connection pool); their statuses."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
    with gateway.http() as http, ThreadPoolExecutor(max_workers=16) as pool:

        def one(key: str) -> int:
            headers = {"Authorization": f"Bearer {key}"}
            return http.post("/v1/completions", json=body, headers=headers).status_code

        return list(pool.map(one, keys))


def metric(gateway: RunningGateway, name: str) -> float:
    """An unlabelled sample of the gateway's /metrics."""
    with gateway.http() as http:
        text = http.get("/metrics").text
    values = [float(line.split()[1]) for line in text.splitlines() if line.split(" ", 1)[0] == name]
    assert len(values) == 1, (name, values)
    return values[0]


def test_a_tenant_store_outage_degrades_and_recovers(
    dev_checkpoint: Path,
    tmp_path: Path,
    database: str,
    pg_proxy: ProxyThread,
    outage_log: ShownLines,
) -> None:
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    via_proxy = through_proxy(database, pg_proxy.port)
    gateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=ScriptedFakeEngine(token_id, interval_s=0.005),
        database_url=via_proxy,
        dev_tenants=True,
        tenant_cache_ttl_s=0.2,
        tenant_stale_max_s=STALE_MAX_S,
        tenant_store_probe_interval_s=PROBE_INTERVAL_S,
        tenant_lookup_timeout_s=0.5,
    )
    try:
        assert stream(gateway, ACME_KEY) == 200  # the key's last good view, read through the proxy
        read_at_s = time.monotonic()
        pg_proxy.cut()
        time.sleep(0.25)  # past the cache TTL: the next request must ask the store
        assert stream(gateway, ACME_KEY) == 200  # served from the last good view
        assert metric(gateway, "sluice_gateway_tenant_store_down") == 1.0
        refused_unavailable(gateway, f"sk-unknown-{uuid.uuid4().hex}")

        lookups_before = metric(gateway, "sluice_gateway_tenant_store_lookups_total")
        flood_started_s = time.monotonic()
        statuses = flood(gateway, [f"sk-random-{uuid.uuid4().hex}" for _ in range(NUM_FLOOD)])
        flood_s = time.monotonic() - flood_started_s
        assert statuses == [503] * NUM_FLOOD
        num_lookups = metric(gateway, "sluice_gateway_tenant_store_lookups_total") - lookups_before
        assert num_lookups <= 1 + flood_s / PROBE_INTERVAL_S, (num_lookups, flood_s)  # probes, not keys
        assert time.monotonic() - read_at_s < STALE_MAX_S, "the flood outlasted the stale limit"
        assert stream(gateway, ACME_KEY) == 200  # known keys unaffected by the flood
        assert metric(gateway, "sluice_gateway_tenant_stale_resolutions_total") >= 2

        time.sleep(max(0.0, read_at_s + STALE_MAX_S + 0.1 - time.monotonic()))
        refused_unavailable(gateway, ACME_KEY)  # past the stale limit: known keys are refused too

        pg_proxy.restore()
        wait_until(lambda: stream(gateway, ACME_KEY) == 200, 10, "the store's recovery")
        assert metric(gateway, "sluice_gateway_tenant_store_down") == 0.0
        with gateway.http() as http:
            resp = http.get("/v1/models", headers={"Authorization": f"Bearer sk-unknown-{uuid.uuid4().hex}"})
        assert resp.status_code == 401  # the store answers again: unknown means unknown
    finally:
        gateway.stop()
    shown = outage_log.lines(logger_prefix="sluice.stores.tenants")
    # one line on entry, one on recovery, from the cache that reports it (not the store's pool as well),
    # not one per request
    assert [(level, name) for level, name, _ in shown] == [
        ("WARNING", "sluice.stores.tenants.cache"),
        ("INFO", "sluice.stores.tenants.cache"),
    ], shown
    assert "unavailable" in shown[0][2] and "available again after" in shown[1][2]
    assert not [
        line for line in outage_log.lines(logger_prefix="sluice.stores.db") if "tenant store" in line[2]
    ]
