"""Issue 4 through the gateway: token budgets and concurrency caps (429 with Retry-After, distinct codes),
the fair queue (a quiet tenant overtakes a noisy one's backlog), deadline drops at the head, classes."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis
from fakes import ScriptedFakeEngine
from harness import MODEL, RunningGateway, start_gateway

from sluice.domain import RequestClass, Tenant
from sluice.engine_client import ReplicaStats
from sluice.stores.tenants.store import SqliteTenantStore
from sluice.text import TextCodec


def create_tenants(state_dir: Path, *tenants: Tenant) -> list[str]:
    async def create() -> list[str]:
        store = SqliteTenantStore(state_dir / "sluice.db")
        await store.open()
        try:
            return [await store.create(t) for t in tenants]
        finally:
            await store.close()

    return asyncio.run(create())


@pytest.fixture
def token_id(dev_checkpoint: Path) -> int:
    return TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]


@pytest.fixture
def gateway_factory(dev_checkpoint: Path, tmp_path: Path) -> Iterator[object]:
    started: list[RunningGateway] = []

    def start(engine: ScriptedFakeEngine, **overrides: object) -> RunningGateway:
        gateway = start_gateway(tmp_path, dev_checkpoint, engine=engine, **overrides)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.stop()


def post(gateway: RunningGateway, key: str, **body: object) -> httpx.Response:
    with httpx.Client(base_url=gateway.base_url, timeout=30) as http:
        return http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 4, **body},
            headers={"Authorization": f"Bearer {key}"},
        )


def assert_retry_after(resp: httpx.Response) -> None:
    assert int(resp.headers["retry-after"]) >= 1 and int(resp.headers["retry-after-ms"]) >= 1


def test_a_tenant_over_its_token_budget_gets_429_with_retry_after(
    gateway_factory, token_id: int, tmp_path: Path
) -> None:
    [key] = create_tenants(tmp_path, Tenant("small", "Small", tokens_per_minute=60))
    gateway = gateway_factory(ScriptedFakeEngine(token_id, interval_s=0.001))
    assert post(gateway, key, max_tokens=20).status_code == 200  # ~21 of 60 tokens reserved, ~21 used
    assert post(gateway, key, max_tokens=20).status_code == 200
    resp = post(gateway, key, max_tokens=30)
    assert resp.status_code == 429
    error = resp.json()["error"]
    assert error["code"] == "tokens_per_minute_exceeded" and "per minute" in error["message"]
    assert_retry_after(resp)
    too_big = post(gateway, key, max_tokens=100)  # more than the whole budget: retrying cannot help
    assert too_big.status_code == 400 and too_big.json()["error"]["code"] == "request_exceeds_token_budget"
    refused = [r for r in gateway.telemetry() if r["outcome"] == "refused"]
    assert {r["error"] for r in refused} == {"tokens_per_minute_exceeded", "request_exceeds_token_budget"}
    with gateway.http() as http:
        metrics = http.get("/metrics").text
    assert (
        'sluice_gateway_refused_total{model="sluice-tiny",reason="tokens_per_minute_exceeded"} 1.0' in metrics
    )


def test_unused_reservation_is_returned_at_the_end(gateway_factory, token_id: int, tmp_path: Path) -> None:
    [key] = create_tenants(tmp_path, Tenant("small", "Small", tokens_per_minute=100))
    engine = ScriptedFakeEngine(token_id, interval_s=0.001)
    gateway = gateway_factory(engine)
    with gateway.http() as http:  # reserve 1 + 90, stop early (a stop string at the first token)
        resp = http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 90, "stop": ["a"]},
            headers={"Authorization": f"Bearer {key}"},
        )
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] < 5
    assert post(gateway, key, max_tokens=80).status_code == 200  # only possible if the rest came back


def test_a_tenant_at_its_concurrency_cap_gets_429(gateway_factory, token_id: int, tmp_path: Path) -> None:
    [key] = create_tenants(tmp_path, Tenant("one", "One", max_concurrent_requests=1))
    gateway = gateway_factory(ScriptedFakeEngine(token_id, interval_s=0.05))
    first: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: first.append(post(gateway, key, max_tokens=10)))
    thread.start()
    while not gateway.gw.engine.requests:  # type: ignore[attr-defined]
        time.sleep(0.002)  # not a bare spin: the gateway's thread needs the GIL
    resp = post(gateway, key)
    thread.join()
    assert first[0].status_code == 200
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "concurrent_requests_exceeded"
    assert_retry_after(resp)
    assert post(gateway, key).status_code == 200  # the lease went with the first request


def test_a_quiet_tenant_overtakes_a_noisy_backlog(gateway_factory, token_id: int, tmp_path: Path) -> None:
    noisy_key, quiet_key = create_tenants(tmp_path, Tenant("noisy", "Noisy"), Tenant("quiet", "Quiet"))
    engine = ScriptedFakeEngine(token_id, interval_s=0.03)
    gateway = gateway_factory(engine, max_waiting_per_replica=1)  # one request in prefill at a time
    client = {key: gateway.client(api_key=key) for key in (noisy_key, quiet_key)}

    def call(key: str) -> None:
        client[key].completions.create(model=MODEL, prompt="x", max_tokens=2)

    noisy = [threading.Thread(target=call, args=(noisy_key,)) for _ in range(12)]
    for t in noisy:
        t.start()
    while len(engine.requests) < 2:  # the noisy backlog is queued behind the first dispatches
        time.sleep(0.002)
    quiet = threading.Thread(target=call, args=(quiet_key,))
    quiet.start()
    for t in [*noisy, quiet]:
        t.join()
    order = [r.cache_scope for r in engine.requests]
    assert order.index("quiet") <= 4, order  # FCFS would put it 13th


def test_a_request_that_cannot_start_before_its_deadline_is_dropped_unserved(
    gateway_factory, token_id: int
) -> None:
    engine = ScriptedFakeEngine(token_id, interval_s=0.001)
    engine.stats = ReplicaStats(num_kv_tokens_total=1000, num_kv_tokens_free=0, num_waiting=0, num_running=0)
    gateway = gateway_factory(engine, request_deadline_s=0.5, itl_target_ms=10.0)  # no KV: nothing dispatches
    resp = post(gateway, "sk-acme-dev")
    assert resp.status_code == 429 and resp.json()["error"]["code"] == "service_overloaded"
    assert "can no longer start before its deadline" in resp.json()["error"]["message"]
    assert_retry_after(resp)
    assert engine.requests == []  # never reached the replica
    assert [r["outcome"] for r in gateway.telemetry()] == ["refused"]
    engine.stats = ReplicaStats(1000, 1000, 0, 0)  # headroom again (read within a poll interval)
    for _ in range(50):
        if post(gateway, "sk-acme-dev").status_code == 200:
            break
    else:
        raise AssertionError("never dispatched once the replica had room")


def test_a_full_queue_refuses_at_admission_with_the_drain_time(gateway_factory, token_id: int) -> None:
    engine = ScriptedFakeEngine(token_id, interval_s=0.001)
    engine.stats = ReplicaStats(1000, 0, 0, 0)  # nothing dispatches; the drain rate floor is 1/s
    gateway = gateway_factory(engine, request_deadline_s=3.0, itl_target_ms=1.0)
    results: list[httpx.Response] = []
    threads = [
        threading.Thread(target=lambda: results.append(post(gateway, "sk-acme-dev"))) for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    messages = [r.json()["error"]["message"] for r in results]
    assert all(r.status_code == 429 for r in results)
    assert any("of queue ahead" in m for m in messages)  # refused at admission: 3+ ahead at 1/s
    assert any("can no longer start" in m for m in messages)  # admitted, then dropped at the head


def test_flex_is_the_batch_class_and_tenants_may_be_kept_out_of_it(
    gateway_factory, token_id: int, tmp_path: Path
) -> None:
    [key] = create_tenants(
        tmp_path, Tenant("chat", "Chat", allowed_classes=frozenset({RequestClass.INTERACTIVE}))
    )
    engine = ScriptedFakeEngine(token_id, interval_s=0.001)
    gateway = gateway_factory(engine)
    assert post(gateway, "sk-acme-dev", service_tier="flex").status_code == 200
    assert engine.requests[-1].priority == 2  # batch: the engine's lowest class, preempted first
    assert post(gateway, "sk-acme-dev", service_tier="default").status_code == 200
    assert engine.requests[-1].priority == 0
    resp = post(gateway, key, service_tier="flex")
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "service_tier_not_allowed"
    bad = post(gateway, key, service_tier="turbo")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "service_tier"


def test_the_openai_client_sees_a_rate_limit_error(gateway_factory, token_id: int, tmp_path: Path) -> None:
    [key] = create_tenants(tmp_path, Tenant("tiny", "Tiny", tokens_per_minute=10))
    gateway = gateway_factory(ScriptedFakeEngine(token_id, interval_s=0.001))
    client = gateway.client(api_key=key)
    client.completions.create(model=MODEL, prompt="x", max_tokens=8)
    with pytest.raises(openai.RateLimitError) as err:
        client.completions.create(model=MODEL, prompt="x", max_tokens=8)
    assert err.value.code == "tokens_per_minute_exceeded"
    assert float(err.value.response.headers["retry-after-ms"]) > 0


def test_two_gateways_share_one_concurrency_cap_through_redis(
    dev_checkpoint: Path, tmp_path: Path, token_id: int
) -> None:
    prefix = f"sluice-test-{uuid.uuid4().hex}:"
    key = "sk-shared-test-key-000000000000"

    async def seed(state_dir: Path) -> None:
        store = SqliteTenantStore(state_dir / "sluice.db")
        await store.open()
        await store.put_tenant(Tenant("shared", "Shared", max_concurrent_requests=2))
        await store.add_key("shared", key)
        await store.close()

    gateways = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        asyncio.run(seed(tmp_path / name))
        engine = ScriptedFakeEngine(token_id, interval_s=0.05)
        gateways.append(
            start_gateway(
                tmp_path / name, dev_checkpoint, engine=engine,
                redis_url="redis://127.0.0.1:6379/0", redis_key_prefix=prefix,
            )
        )  # fmt: skip
    try:
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda g=g: results.append(post(g, key, max_tokens=8).status_code))
            for g in gateways
            for _ in range(3)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [200, 200, 429, 429, 429, 429]
    finally:
        for g in gateways:
            g.stop()
        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        for k in client.scan_iter(match=f"{prefix}*"):
            client.delete(k)
        client.close()
