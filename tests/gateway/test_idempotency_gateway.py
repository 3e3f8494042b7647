"""Issue 5's Idempotency-Key through the gateway: one generation per key while it runs or after it
finished, replay after completion without billing, 409 while running, 422 for another body, start-over
after a cancel (each attempt billed on its own row, issue 9; more in test_billing_integrity.py), and 503
with Retry-After for keyed requests while the Redis store is cut (keyless requests go on)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from fakes import ScriptedFakeEngine
from harness import MODEL, RunningGateway, start_gateway
from redis_run import REDIS_URL, RUN_PREFIX, delete_run_keys, need_redis, unreachable_reason
from tcp_proxy import ProxyThread

from gateway.openai.idempotency import fingerprint
from gateway.openai.schemas import CompletionRequest
from sluice.stores.idempotency.redis import RedisIdempotencyStore
from sluice.text import TextCodec

KEY_HEADER = "Idempotency-Key"


@pytest.fixture
def slow_gateway(dev_checkpoint: Path, tmp_path: Path) -> Iterator[tuple[RunningGateway, ScriptedFakeEngine]]:
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    engine = ScriptedFakeEngine(token_id, interval_s=0.02)
    gateway = start_gateway(tmp_path, dev_checkpoint, engine=engine)
    yield gateway, engine
    gateway.stop()


def post(gateway: RunningGateway, key: str | None, stream: bool = False, **body: object) -> httpx.Response:
    headers = {"Authorization": "Bearer sk-acme-dev", **({KEY_HEADER: key} if key is not None else {})}
    payload = {"model": MODEL, "prompt": "x", "max_tokens": 10, "stream": stream, **body}
    with httpx.Client(base_url=gateway.base_url, timeout=30) as http:
        return http.post("/v1/completions", json=payload, headers=headers)


def streamed_text(resp: httpx.Response) -> str:
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
    return "".join(e["choices"][0]["text"] for e in events if e.get("choices"))


def test_twenty_concurrent_requests_with_one_key_generate_once(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    results: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: results.append(post(gateway, "order-17"))) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [r for r in results if r.status_code == 200]
    busy = [r for r in results if r.status_code == 409]
    assert len(ok) + len(busy) == 20 and len(ok) >= 1
    assert all(r.json()["error"]["code"] == "idempotency_key_in_progress" for r in busy)
    assert len(engine.requests) == 1  # one generation
    assert len({r.json()["id"] for r in ok}) == 1  # late ones got the replay of the same response
    rows = [r for r in gateway.usage(limit="1000")["data"] if r["request_id"] == ok[0].json()["id"]]
    assert len(rows) == 1 and rows[0]["output_tokens"] == 10
    assert gateway.usage()["totals"]["num_requests"] == 1


def test_a_retry_after_completion_replays_without_billing(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    first = post(gateway, "k-replay")
    assert first.status_code == 200
    gateway.usage_row(first.json()["id"])
    before = gateway.usage()["totals"]
    again = post(gateway, "k-replay")
    streamed = post(gateway, "k-replay", stream=True)  # the stored result, replayed as SSE
    assert again.json()["choices"] == first.json()["choices"] and again.json()["id"] == first.json()["id"]
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert streamed_text(streamed) == first.json()["choices"][0]["text"]
    assert len(engine.requests) == 1
    assert gateway.usage()["totals"] == before
    replayed = [r for r in gateway.telemetry() if r["outcome"] == "replayed"]
    assert len(replayed) == 2 and {r["idempotency_key"] for r in replayed} == {"k-replay"}


def test_a_key_reused_with_another_body_is_422(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, _ = slow_gateway
    assert post(gateway, "k-body", max_tokens=3).status_code == 200
    resp = post(gateway, "k-body", max_tokens=4)
    assert resp.status_code == 422 and resp.json()["error"]["code"] == "idempotency_key_reused"
    assert post(gateway, "k-body", max_tokens=3, stream=True).status_code == 200  # stream is not the body
    bad = post(gateway, "x" * 300)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_idempotency_key"


def test_a_cancelled_attempt_starts_over_and_each_attempt_is_billed(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    headers = {"Authorization": "Bearer sk-acme-dev", KEY_HEADER: "k-cancel"}
    body = {"model": MODEL, "prompt": "x", "max_tokens": 40, "stream": True}
    with (
        httpx.Client(base_url=gateway.base_url, timeout=30) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
    ):
        for n, _line in enumerate(resp.iter_lines()):
            if n >= 3:
                break  # the client goes away mid-stream
    deadline = time.monotonic() + 5
    while not engine.cancelled and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(engine.cancelled) == 1
    while not any(r["attempt"] == 1 for r in gateway.telemetry()) and time.monotonic() < deadline:
        time.sleep(0.02)
    retry = post(gateway, "k-cancel", stream=True, max_tokens=40)
    assert retry.status_code == 200 and streamed_text(retry) == "ab" * 40  # started over, not resumed
    records = [r for r in gateway.telemetry() if r["outcome"] != "replayed"]
    first, second = records[-2], records[-1]
    assert (first["attempt"], first["outcome"]) == (1, "cancelled") and first["output_tokens"] > 0
    assert (second["attempt"], second["outcome"]) == (2, "finished")
    assert second["superseded_output_tokens"] == first["output_tokens"]  # the waste, reported
    assert first["request_id"] != second["request_id"]  # every attempt is its own request
    row = gateway.usage_row(second["request_id"])
    assert row["output_tokens"] == 40 and row["status"] == "finished"
    assert (row["idempotency_key"], row["attempt"]) == ("k-cancel", 2)
    cancelled = gateway.usage_row(first["request_id"])
    assert (cancelled["output_tokens"], cancelled["status"]) == (first["output_tokens"], "cancelled")
    totals = gateway.usage()["totals"]
    assert totals["num_requests"] == 2 and totals["output_tokens"] == 40 + first["output_tokens"]


def test_the_api_docs_declare_the_header_and_say_start_over(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, _ = slow_gateway
    with gateway.http() as http:
        schema = http.get("/schema/openapi.json").json()
    operation = schema["paths"]["/v1/chat/completions"]["post"]
    assert any(p["name"] == "Idempotency-Key" and p["in"] == "header" for p in operation["parameters"])
    assert "STARTS OVER" in operation["description"]


@pytest.fixture
def redis_up() -> Iterator[None]:
    """The test Redis answers (else skip, or fail under CI=true); this run's keys are deleted at the end."""
    need_redis(unreachable_reason())
    yield
    delete_run_keys()


@pytest.fixture
def redis_proxy(redis_up: None) -> Iterator[ProxyThread]:
    """A proxy in front of the test Redis."""
    host, _, port = REDIS_URL.removeprefix("redis://").partition("/")[0].partition(":")
    proxy = ProxyThread(host, int(port or 6379))
    yield proxy
    proxy.close()


def test_with_the_idempotency_store_cut_keyed_requests_get_503_and_keyless_ones_go_on(
    dev_checkpoint: Path, tmp_path: Path, redis_proxy: ProxyThread
) -> None:
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    gateway = start_gateway(
        tmp_path, dev_checkpoint, engine=ScriptedFakeEngine(token_id, interval_s=0.001), dev_tenants=True,
        redis_url=f"redis://127.0.0.1:{redis_proxy.port}/0", redis_key_prefix=f"{RUN_PREFIX}gw:",
    )  # fmt: skip
    try:
        done = post(gateway, "k-before")
        assert done.status_code == 200
        redis_proxy.cut()
        for key in ("k-new", "k-before"):  # neither a new key nor a replay can be answered safely
            refused = post(gateway, key)
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["code"] == "idempotency_store_unavailable"
            assert refused.json()["error"]["type"] == "server_error"
            assert int(refused.headers["retry-after"]) >= 1
        keyless = post(gateway, None)  # never touches the store (the quota fails open meanwhile)
        assert keyless.status_code == 200 and keyless.json()["usage"]["completion_tokens"] == 10
        with gateway.http() as http:
            metrics = http.get("/metrics").text
        assert (
            'sluice_gateway_refused_total{model="sluice-tiny",reason="idempotency_store_unavailable"} 2.0'
            in metrics
        )

        redis_proxy.restore()
        assert post(gateway, "k-before").json()["id"] == done.json()["id"]  # replayed, as before the cut
        assert post(gateway, "k-new").status_code == 200
        assert gateway.usage()["totals"]["num_requests"] == 3  # the refusals were not billed
    finally:
        gateway.stop()


def test_a_result_stored_before_ids_were_per_attempt_replays_with_its_old_id(
    dev_checkpoint: Path, tmp_path: Path, redis_up: None
) -> None:
    """Results a gateway of the previous version stored (no id in them) keep answering, under the id that
    version gave them (derived from the tenant and the key), for the rest of their TTL."""
    prefix = f"{RUN_PREFIX}legacy:"
    body = {"model": MODEL, "prompt": "x", "max_tokens": 10}
    old_result = {"text": "abab", "finish_reason": "length", "prompt_tokens": 1, "output_tokens": 10,
                  "filter_message": None}  # fmt: skip

    async def store_old_result() -> None:
        store = RedisIdempotencyStore(REDIS_URL, key_prefix=f"{prefix}idem:")
        await store.open()
        try:
            body_fingerprint = fingerprint("/v1/completions", msgspec.convert(body, CompletionRequest))
            await store.begin("acme", "k-old", body_fingerprint, 60.0)
            assert await store.complete("acme", "k-old", 1, json.dumps(old_result).encode(), 3600.0)
        finally:
            await store.close()

    asyncio.run(store_old_result())
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    engine = ScriptedFakeEngine(token_id, interval_s=0.001)
    gateway = start_gateway(tmp_path, dev_checkpoint, engine=engine, dev_tenants=True,
                            redis_url=REDIS_URL, redis_key_prefix=prefix)  # fmt: skip
    try:
        replay = post(gateway, "k-old")
        digest = hashlib.sha256(b"acme\0k-old").hexdigest()[:32]
        assert replay.status_code == 200 and replay.json()["id"] == f"cmpl-idem-{digest}"
        assert replay.json()["choices"][0]["text"] == "abab" and engine.requests == []
    finally:
        gateway.stop()
