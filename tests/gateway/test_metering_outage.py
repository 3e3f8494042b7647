"""Issue 5, metering through failures, end to end: a gateway whose PostgreSQL ledger sits behind a proxy
the test cuts. A burst during the outage (finished, streamed, and streams the client abandons) is served
normally; once PostgreSQL is back the ledger holds exactly one row per request, with the tokens each
produced, matching telemetry one for one; records still pending at a shutdown are written after the
restart, and a record replayed twice is still one row."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway, wait_until
from pg import through_proxy
from tcp_proxy import ProxyThread

from gateway.metering.outbox import FILE_NAME, Outbox, rec_line
from sluice.domain import Outcome, UsageRecord
from sluice.text import TextCodec

AUTH = {"Authorization": f"Bearer {ACME_KEY}"}
NUM_BURST = 30


def ledger_rows(database: str) -> dict[str, tuple[int, str]]:
    """request_id -> (output_tokens, status), read straight from the server (not through the proxy)."""
    with psycopg.connect(database) as conn:
        cur = conn.execute("SELECT request_id, output_tokens, status FROM usage WHERE tenant_id = 'acme'")
        return {r: (o, s) for r, o, s in cur.fetchall()}


def telemetry_rows(gateway: RunningGateway) -> dict[str, tuple[int, str]]:
    return {t["request_id"]: (t["output_tokens"], t["outcome"]) for t in gateway.telemetry()}


def complete(gateway: RunningGateway, max_tokens: int) -> str:
    with gateway.http() as http:
        resp = http.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": max_tokens}, headers=AUTH
        )
    resp.raise_for_status()
    body = resp.json()
    assert body["usage"]["completion_tokens"] == max_tokens
    request_id: str = body["id"]
    return request_id


def stream(gateway: RunningGateway, max_tokens: int, leave_after: int | None) -> str:
    """A streamed completion, read to the end, or abandoned (connection closed) after ``leave_after``
    events."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": max_tokens, "stream": True}
    events: list[str] = []
    with gateway.http() as http, http.stream("POST", "/v1/completions", json=body, headers=AUTH) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
                if leave_after is not None and len(events) == leave_after:
                    break  # leaving the block closes the connection mid-stream
    if leave_after is None:
        assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    request_id: str = json.loads(events[0])["id"]
    return request_id


def burst(gateway: RunningGateway) -> list[tuple[str, str]]:
    """NUM_BURST concurrent requests, a third of each kind; (kind, request_id) of each."""

    def one(i: int) -> tuple[str, str]:
        if i % 3 == 0:
            return "finished", complete(gateway, max_tokens=8)
        if i % 3 == 1:
            return "streamed", stream(gateway, max_tokens=8, leave_after=None)
        return "abandoned", stream(gateway, max_tokens=200, leave_after=3)

    with ThreadPoolExecutor(max_workers=NUM_BURST) as pool:
        return list(pool.map(one, range(NUM_BURST)))


def test_a_ledger_outage_loses_and_doubles_nothing_across_a_restart(
    dev_checkpoint: Path, tmp_path: Path, database: str, pg_proxy: ProxyThread
) -> None:
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    via_proxy = through_proxy(database, pg_proxy.port)

    def start() -> RunningGateway:
        engine = ScriptedFakeEngine(token_id, interval_s=0.01)
        # The tenant cache outlives the outage: this test is about the ledger, not about auth.
        return start_gateway(tmp_path, dev_checkpoint, engine=engine, database_url=via_proxy,
                             tenant_cache_ttl_s=3600.0)  # fmt: skip

    gateway = start()
    try:
        warm = complete(gateway, max_tokens=2)  # resolves the key into the cache while PostgreSQL is up
        wait_until(lambda: warm in ledger_rows(database), 5, "the first row")

        pg_proxy.cut()
        served = burst(gateway)  # every client got its response (asserted inside)
        assert sorted(kind for kind, _ in served).count("abandoned") == NUM_BURST // 3
        wait_until(lambda: len(gateway.telemetry()) == 1 + NUM_BURST, 5, "telemetry of the burst")
        meter = gateway.gw.meter
        # NOTE: a request's telemetry line is written before its usage record reaches the outbox.
        wait_until(lambda: meter.num_pending == NUM_BURST, 5, "the burst's records in the outbox")
        assert meter.ledger_down
        assert ledger_rows(database).keys() == {warm}
        with gateway.http() as http:
            metrics = http.get("/metrics").text
        assert f"sluice_gateway_usage_outbox_pending {float(NUM_BURST)}" in metrics

        pg_proxy.restore()
        wait_until(lambda: len(ledger_rows(database)) == 1 + NUM_BURST, 15, "the pending rows")
        rows, telemetry = ledger_rows(database), telemetry_rows(gateway)
        assert rows == telemetry  # one row per request, with the tokens each produced
        assert meter.num_pending == 0 and not meter.ledger_down
        for kind, request_id in served:
            tokens, status = rows[request_id]
            if kind == "abandoned":
                assert status == Outcome.CANCELLED and 3 <= tokens < 200
            else:
                assert (tokens, status) == (8, Outcome.FINISHED)
        assert gateway.usage()["totals"]["num_requests"] == 1 + NUM_BURST  # GET /v1/usage agrees
        replayed_id, replayed = served[0][1], rows[served[0][1]]
        with gateway.http() as http:
            metrics = http.get("/metrics").text
        assert f"sluice_gateway_usage_records_written_total {float(1 + NUM_BURST)}" in metrics
        assert "sluice_gateway_usage_outbox_pending 0.0" in metrics
        assert "sluice_gateway_usage_ledger_failures_total 0.0" not in metrics

        # Cut again and shut down with records pending: they must survive the restart.
        pg_proxy.cut()
        after = [complete(gateway, max_tokens=4) for _ in range(5)]
        wait_until(lambda: gateway.gw.meter.num_pending == 5, 5, "five pending records")
    finally:
        gateway.stop()
    assert not gateway.thread.is_alive(), "the gateway did not stop with its ledger unreachable"

    asyncio.run(_check_outbox_then_add_a_replay(tmp_path / "outbox", after, replayed_id, replayed))
    pg_proxy.restore()
    gateway = start()
    try:
        wait_until(lambda: gateway.gw.meter.num_pending == 0, 15, "the replay after the restart")
        rows, telemetry = ledger_rows(database), telemetry_rows(gateway)
        assert len(rows) == 1 + NUM_BURST + 5 == len(telemetry)
        assert rows == telemetry and all(rows[r] == (4, Outcome.FINISHED) for r in after)
        assert rows[replayed_id] == replayed  # written twice, one row, unchanged
        assert gateway.usage()["totals"]["num_requests"] == 1 + NUM_BURST + 5
    finally:
        gateway.stop()


async def _check_outbox_then_add_a_replay(
    directory: Path, pending_ids: list[str], written_id: str, written: tuple[int, str]
) -> None:
    """The stopped gateway left exactly the 5 unwritten records pending; then append a second copy of a
    record the ledger already holds, as a lost done line would leave it."""
    box = Outbox(directory)  # the stopped gateway released the lock
    left = await box.open()
    assert sorted(r.request_id for _, r in left) == sorted(pending_ids)
    template = left[0][1]
    await box.close()
    tokens, status = written
    again = UsageRecord(
        template.tenant_id, written_id, template.model, template.model_version, template.prompt_tokens,
        tokens, Outcome(status), template.started_at, template.finished_at,
    )  # fmt: skip
    with open(directory / FILE_NAME, "ab") as f:
        f.write(rec_line(10_000, again))
