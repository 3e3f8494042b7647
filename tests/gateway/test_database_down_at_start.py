"""A real gateway started while its PostgreSQL (tenant store and usage ledger) cannot be reached, through a
TCP proxy that is cut before the start and restored later: the gateway starts anyway and answers 503
(never a 500, never a crash), opens both stores in the background once the server answers (the dev tenants
seeded then), bills what it served, and a later ledger outage turns GET /v1/usage into a 503."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway, wait_until
from pg import through_proxy
from tcp_proxy import ProxyThread

from sluice.text import TextCodec


def complete(gateway: RunningGateway) -> httpx.Response:
    with gateway.http() as http:
        return http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 4},
            headers={"Authorization": f"Bearer {ACME_KEY}"},
        )


def usage(gateway: RunningGateway) -> httpx.Response:
    with gateway.http() as http:
        return http.get("/v1/usage", headers={"Authorization": f"Bearer {ACME_KEY}"})


def billed(gateway: RunningGateway) -> int:
    """Requests in the tenant's usage; -1 while the ledger cannot answer (503: it opens on its own
    backoff, independently of the tenant store)."""
    resp = usage(gateway)
    if resp.status_code == 503:
        assert error_code(resp) == "usage_ledger_unavailable", resp.text
        return -1
    assert resp.status_code == 200, resp.text
    num_requests: int = resp.json()["totals"]["num_requests"]
    return num_requests


def error_code(resp: httpx.Response) -> str:
    code: str = json.loads(resp.text)["error"]["code"]
    return code


def test_a_gateway_starts_without_its_database_and_opens_it_when_it_answers(
    dev_checkpoint: Path, tmp_path: Path, database: str, pg_proxy: ProxyThread
) -> None:
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    via_proxy = through_proxy(database, pg_proxy.port)
    pg_proxy.cut()
    started_s = time.monotonic()
    gateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=ScriptedFakeEngine(token_id, interval_s=0.001),
        database_url=via_proxy,
        dev_tenants=True,
        tenant_cache_ttl_s=0.2,
        tenant_stale_max_s=30.0,
        tenant_store_probe_interval_s=0.2,
        tenant_lookup_timeout_s=0.5,
    )
    try:
        assert time.monotonic() - started_s < 15  # one short attempt per store, not a wait for the server
        with gateway.http() as http:
            assert http.get("/healthz").status_code == 200
        resp = complete(gateway)
        assert resp.status_code == 503, resp.text
        assert error_code(resp) == "tenant_store_unavailable" and "Retry-After" in resp.headers

        pg_proxy.restore()
        wait_until(lambda: complete(gateway).status_code == 200, 20, "the stores to open in the background")
        # The ledger opened too (the same server): what was served is billed, once.
        wait_until(lambda: billed(gateway) >= 1, 30, "the ledger to open and the usage row to land")
        assert billed(gateway) == 1

        pg_proxy.cut()  # the tenant is known now (its last good view); the ledger's reads fail
        resp = usage(gateway)
        assert resp.status_code == 503, resp.text
        assert error_code(resp) == "usage_ledger_unavailable" and "Retry-After" in resp.headers
    finally:
        gateway.stop()
