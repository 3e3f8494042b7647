"""The telemetry record of real requests through the gateway (its file and its Redis stream sinks both on):
the tenant class, the prefill and inter-token figures, billed and wasted tokens for a request that
finished, failed mid-stream, was replayed or refused; and the wasted-token rule for every outcome."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway
from redis_run import REDIS_URL, RUN_PREFIX, unreachable_reason
from services import service_missing

from gateway.openai.job import IdempotentAttempt
from gateway.openai.records import Ended, _wasted_tokens
from gateway.telemetry import TELEMETRY_SCHEMA
from gateway.telemetry.redis_stream import RECORD_FIELD
from sluice.domain import Outcome
from sluice.text import TextCodec

NUM_TOKENS = 6
STREAM_KEY = f"{RUN_PREFIX}telemetry-gateway"


@pytest.fixture(scope="module")
def engine(dev_checkpoint: Path) -> ScriptedFakeEngine:
    return ScriptedFakeEngine(TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0], interval_s=0.002)


@pytest.fixture(scope="module")
def gateway(
    engine: ScriptedFakeEngine, dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    reason = unreachable_reason()
    if reason is not None:
        service_missing(reason)
    gateway = start_gateway(
        tmp_path_factory.mktemp("gateway_telemetry"),
        dev_checkpoint,
        engine=engine,
        telemetry_sinks="file,redis",
        redis_url=REDIS_URL,
        telemetry_redis_stream=STREAM_KEY,
    )
    yield gateway
    gateway.stop()
    with redis.Redis.from_url(REDIS_URL) as client:
        client.delete(STREAM_KEY)


def _post(gateway: RunningGateway, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    with gateway.http() as http:
        return http.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "hello there", "max_tokens": NUM_TOKENS, **body},
            headers={"Authorization": f"Bearer {ACME_KEY}", **(headers or {})},
        )


def _records(gateway: RunningGateway, request_id: str) -> list[dict[str, Any]]:
    return [r for r in gateway.telemetry() if r["request_id"] == request_id]


def _streamed(request_id: str) -> list[dict[str, Any]]:
    with redis.Redis.from_url(REDIS_URL) as client:
        entries = client.xrange(STREAM_KEY)
    records = [json.loads(fields[RECORD_FIELD.encode()]) for _, fields in entries]
    return [r for r in records if r["request_id"] == request_id]


def test_a_finished_request_is_billed_wastes_nothing_and_is_the_same_record_in_every_sink(
    gateway: RunningGateway,
) -> None:
    resp = _post(gateway, service_tier="flex")
    assert resp.status_code == 200
    usage = resp.json()["usage"]
    [record] = _records(gateway, resp.json()["id"])  # flushed every sink: the stream has it too
    assert _streamed(record["request_id"]) == [record]
    assert record["schema"] == TELEMETRY_SCHEMA and record["request_class"] == "batch"
    assert record["outcome"] == "finished" and record["replica"] == "fake"
    assert record["billed_tokens"] == usage["total_tokens"] == usage["prompt_tokens"] + NUM_TOKENS
    assert record["wasted_tokens"] == 0
    assert 0 < record["replica_ttft_ms"] <= record["ttft_ms"]  # the prefill figure, inside TTFT
    # One token a delta, every 2 ms: every gap is an arrival.
    assert 0 < record["inter_token_p50_ms"] <= record["inter_token_p95_ms"] <= record["inter_token_max_ms"]
    assert record["batch_id"] is None and record["custom_id"] is None


def test_a_request_failed_mid_stream_wastes_what_it_generated(
    gateway: RunningGateway, engine: ScriptedFakeEngine
) -> None:
    engine.fail_after = 3
    try:
        resp = _post(gateway, stream=True)
    finally:
        engine.fail_after = None
    assert resp.status_code == 200 and '"error"' in resp.text  # the error event after 3 tokens
    request_id = resp.headers["x-request-id"]
    [record] = _records(gateway, request_id)
    assert record["outcome"] == "failed" and record["request_class"] == "interactive"
    assert record["output_tokens"] == record["wasted_tokens"] == 3
    assert record["billed_tokens"] == record["prompt_tokens"] + 3  # the replica ran it: billed


def test_a_replay_and_a_refusal_each_write_one_record_billing_nothing(gateway: RunningGateway) -> None:
    key = {"Idempotency-Key": f"k-{uuid.uuid4().hex}"}
    first = _post(gateway, key)
    replay = _post(gateway, key)
    refused = _post(gateway, key, max_tokens=NUM_TOKENS - 1)  # the same key, another body: 422
    assert first.status_code == replay.status_code == 200 and refused.status_code == 422
    records = _records(gateway, first.json()["id"])
    assert [r["outcome"] for r in records] == ["finished", "replayed"]
    assert records[1]["billed_tokens"] == records[1]["wasted_tokens"] == 0
    [refusal] = _records(gateway, refused.headers["x-request-id"])
    assert (refusal["outcome"], refusal["error"]) == ("refused", "idempotency_key_reused")
    assert refusal["billed_tokens"] == refusal["wasted_tokens"] == refusal["num_dispatches"] == 0


@pytest.mark.parametrize(
    ("outcome", "superseded", "wasted"),
    [
        (Outcome.FINISHED, 0, 0),
        (Outcome.DEADLINE, 0, 0),  # a cut but complete response: received
        (Outcome.FAILED, 0, 10),  # all of it: the client got an error
        (Outcome.FILTERED, 0, 10),
        (Outcome.CANCELLED, 0, 4),  # the unread ones only
        (Outcome.CANCELLED, 7, 11),  # and the previous attempt's, which this one replaced
        (Outcome.FINISHED, 7, 7),
    ],
)
def test_wasted_tokens_by_outcome(outcome: Outcome, superseded: int, wasted: int) -> None:
    ended = Ended(outcome, None, 10, None, True, num_unread_tokens=4 if outcome is Outcome.CANCELLED else 0)
    attempt = IdempotentAttempt("k", 2, superseded) if superseded else None
    assert _wasted_tokens(ended, attempt) == wasted
