"""Failover in one version's scheduler and in the request path, over named fake engines: a replica a request
could not reach is suspended at once and resumes only once it answers ready; a re-dispatched request goes
ahead of the fair queue and is still dropped at its deadline; the last replica taking work is never
suspended. Through the API (a static gateway over fake replicas): a request that lost its replica before
its first token completes on another with one usage row, as does one whose tokens' text was all held
back (billed for the other's output only), and a non-streaming request or a batch line that lost it
mid-answer (their answer goes back whole); one that keeps losing it fails with 503 after
SLUICE_MAX_REDISPATCHES and no usage row, as does one with no other replica (at once) and one that finds
no room on the others before its deadline, though one whose lost replica ran its prompt keeps a row of
it; one that loses it mid-stream ends with an error event the openai SDK raises and a usage row of the
tokens it had."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncGenerator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from fakes import ScriptedFakeEngine
from harness import MODEL, RunningGateway, start_gateway
from metrics_text import read_metric

from gateway.errors import OpenAIError
from gateway.metering.outbox import FILE_NAME as OUTBOX_FILE
from gateway.metrics import GatewayMetrics
from gateway.scheduling.scheduler import ModelScheduler
from sluice.domain import RequestClass
from sluice.engine_client import (
    Delta,
    EngineClient,
    EngineError,
    EngineErrorKind,
    GenerateRequest,
    ReplicaStats,
)
from sluice.policy.fair_queue import WaitingRequest
from sluice.settings import Settings
from sluice.text import TextCodec


class UnreachableFakeEngine(ScriptedFakeEngine):
    """A ``ScriptedFakeEngine`` whose first ``num_unreachable_calls`` generations fail as a replica that
    cannot be reached does (UNAVAILABLE, no token), or, with ``lost_after`` tokens, lose the connection
    mid-stream; ``reachable`` is what its readiness check answers."""

    def __init__(
        self,
        token_id: int,
        *,
        num_unreachable_calls: int = 0,
        lost_after: int | None = None,
        interval_s: float = 0.001,
    ) -> None:
        super().__init__(token_id, interval_s)
        self.num_unreachable_calls = num_unreachable_calls
        self.lost_after = lost_after
        self.reachable = True
        self.num_calls = 0

    async def ready(self) -> bool:
        return self.reachable

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        self.num_calls += 1
        if self.num_calls <= self.num_unreachable_calls:
            self.requests.append(request)
            raise EngineError(EngineErrorKind.UNAVAILABLE, "StatusCode.UNAVAILABLE: Connection refused")
        num_sent = 0
        async for delta in super().generate(request):
            if self.lost_after is not None and num_sent == self.lost_after:
                raise EngineError(EngineErrorKind.UNAVAILABLE, "StatusCode.UNAVAILABLE: Socket closed")
            num_sent += len(delta.token_ids)
            yield delta


def _engine(name: str) -> UnreachableFakeEngine:
    engine = UnreachableFakeEngine(5)
    engine.replica = name  # an instance attribute: each fake is its own replica
    return engine


def _queued(request_id: str, arrival_s: float | None = None, deadline_in_s: float = 30.0) -> WaitingRequest:
    now = time.monotonic()
    arrival_s = now if arrival_s is None else arrival_s
    return WaitingRequest(
        request_id, "acme", 1.0, RequestClass.INTERACTIVE, 8, 8, arrival_s, now + deadline_in_s
    )


def _scheduler(tmp_path: Path, metrics: GatewayMetrics, **overrides: object) -> ModelScheduler:
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path, **overrides)
    return ModelScheduler("m", (), settings, metrics, version="1")


async def _dispatched_to(scheduler: ModelScheduler, request_id: str) -> EngineClient:
    """Where a request is dispatched (released at once: it holds nothing)."""
    slot = await scheduler.wait_for_dispatch(_queued(request_id))
    scheduler.release(slot)
    return slot.engine


@pytest.mark.anyio
async def test_an_unreachable_replica_is_suspended_at_once_and_resumes_only_once_it_answers_ready(
    tmp_path: Path,
) -> None:
    metrics = GatewayMetrics()
    scheduler = _scheduler(tmp_path, metrics, replica_poll_interval_ms=10, replica_suspension_ms=50)
    a, b = _engine("a"), _engine("b")
    await scheduler.start()
    await scheduler.add_replica(a)
    await scheduler.add_replica(b)
    first = await scheduler.wait_for_dispatch(_queued("r0"))
    lost, other = (a, b) if first.engine is a else (b, a)
    lost.reachable = False
    scheduler.suspend(first)
    scheduler.suspend(first)  # a second request failing on it: still one suspension
    scheduler.release(first)
    assert metrics.replica_suspensions.labels("m", "1")._value.get() == 1
    engines = [await _dispatched_to(scheduler, f"r{i}") for i in range(4)]
    await asyncio.sleep(0.3)  # several suspension periods: it is asked, says not ready, stays out
    engines += [await _dispatched_to(scheduler, f"s{i}") for i in range(4)]
    assert set(engines) == {other}
    lost.reachable = True  # the blip is over: back within a suspension period and a poll
    deadline = time.monotonic() + 5
    while await _dispatched_to(scheduler, "later") is not lost:
        assert time.monotonic() < deadline, "the replica did not come back after answering ready"
        await asyncio.sleep(0.02)
    await scheduler.close()


@pytest.mark.anyio
async def test_the_last_replica_taking_work_is_not_suspended(tmp_path: Path) -> None:
    """With nowhere else to go, requests keep failing fast on it rather than queueing to their deadline."""
    metrics = GatewayMetrics()
    scheduler = _scheduler(tmp_path, metrics)
    a, b = _engine("a"), _engine("b")
    await scheduler.add_replica(a)
    await scheduler.add_replica(b)
    on_a = await scheduler.wait_for_dispatch(_queued("r0"))
    on_b = await scheduler.wait_for_dispatch(_queued("r1"))
    assert {on_a.engine, on_b.engine} == {a, b}
    scheduler.suspend(on_a)
    assert not scheduler.takes_work_besides(on_b)
    scheduler.suspend(on_b)  # the last one: stays in the dispatch pass
    for slot in (on_a, on_b):
        scheduler.release(slot)
    assert await _dispatched_to(scheduler, "r2") is on_b.engine
    assert metrics.replica_suspensions.labels("m", "1")._value.get() == 1
    await scheduler.close()


@pytest.mark.anyio
async def test_a_redispatched_request_goes_ahead_of_the_fair_queue(tmp_path: Path) -> None:
    metrics = GatewayMetrics()
    scheduler = _scheduler(tmp_path, metrics, max_waiting_per_replica=1)
    await scheduler.add_replica(_engine("a"))
    busy = await scheduler.wait_for_dispatch(_queued("busy"))  # no first token: the gate is shut
    earlier_s = time.monotonic() - 1.0
    queued = asyncio.create_task(scheduler.wait_for_dispatch(_queued("queued")))
    await asyncio.sleep(0)
    # Lost by another replica before its first token; it arrived before "queued".
    again = asyncio.create_task(scheduler.wait_for_dispatch(_queued("again", earlier_s), redispatch=True))
    await asyncio.sleep(0)
    assert not queued.done() and not again.done()
    scheduler.release(busy)  # one place: the re-dispatched request takes it
    await asyncio.sleep(0)
    assert again.done() and not queued.done()
    assert metrics.redispatches.labels("m", "1")._value.get() == 1
    scheduler.release(again.result())
    scheduler.release(await queued)
    await scheduler.close()


@pytest.mark.anyio
async def test_a_redispatched_request_with_no_replica_is_dropped_at_its_deadline(tmp_path: Path) -> None:
    scheduler = _scheduler(tmp_path, GatewayMetrics())
    await scheduler.start()  # its background pass drops what can no longer meet its deadline
    began = time.monotonic()
    with pytest.raises(OpenAIError) as refused:
        await scheduler.wait_for_dispatch(_queued("lost", deadline_in_s=0.3), redispatch=True)
    assert refused.value.status_code == 429 and time.monotonic() - began < 2.0
    await scheduler.close()


# ----- through the API: a static gateway over fake replicas (the first one its own, the others added) -----
@pytest.fixture(scope="module")
def codec(dev_checkpoint: Path) -> TextCodec:
    return TextCodec.from_checkpoint(dev_checkpoint)


def _fake(codec: TextCodec, name: str, **kwargs: Any) -> UnreachableFakeEngine:
    engine = UnreachableFakeEngine(codec.encode("ab")[0], **kwargs)
    engine.replica = name
    return engine


@contextmanager
def _gateway(
    tmp_path: Path, dev_checkpoint: Path, engines: list[UnreachableFakeEngine], **overrides: Any
) -> Iterator[RunningGateway]:
    """A gateway whose model has ``engines`` as its replicas; the first is dispatched to first (the
    router's ties go to the smallest replica id: name them in order). Stopped on leaving."""
    gateway = start_gateway(tmp_path, dev_checkpoint, engine=engines[0], **overrides)
    try:
        loop = gateway.server.servers[0].get_loop()  # the gateway's event loop, which owns its schedulers
        for engine in engines[1:]:
            added = gateway.gw.router.pools.add_static(MODEL, "1", engine)
            asyncio.run_coroutine_threadsafe(added, loop).result(10)
        yield gateway
    finally:
        gateway.stop()


def _billed_once(gateway: RunningGateway, request_id: str) -> dict[str, Any]:
    """The request's one usage row: a re-dispatch keeps its record, so never a second."""
    row = gateway.usage_row(request_id)
    assert [r["request_id"] for r in gateway.usage(limit="100")["data"]].count(request_id) == 1
    return row


def test_a_request_that_lost_its_replica_before_a_token_completes_with_one_usage_row(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    lost, other = _fake(codec, "a", num_unreachable_calls=1), _fake(codec, "b")
    with _gateway(tmp_path, dev_checkpoint, [lost, other]) as gateway:
        stream = gateway.client().completions.create(
            model=MODEL, prompt="hello", max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
        request_id = chunks[0].id
        assert [r.request_id for r in lost.requests + other.requests] == [request_id] * 2
        row = _billed_once(gateway, request_id)
        assert row["output_tokens"] == 6 and row["status"] == "finished"
        [record] = [r for r in gateway.telemetry() if r["request_id"] == request_id]
        assert (
            record["num_dispatches"] == 2 and record["failed_replicas"] == ["a"] and record["replica"] == "b"
        )
        assert read_metric(gateway.base_url + "/metrics", "sluice_gateway_redispatches_total") == 1


def test_a_request_that_keeps_losing_its_replica_gets_503_after_its_redispatches_and_no_usage_row(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    engines = [_fake(codec, name, num_unreachable_calls=100) for name in ("a", "b", "c")]
    with _gateway(tmp_path, dev_checkpoint, engines, max_redispatches=1) as gateway:
        with pytest.raises(openai.APIStatusError) as failed:
            gateway.client().completions.create(model=MODEL, prompt="hello", max_tokens=6, stream=True)
        assert failed.value.status_code == 503 and failed.value.code == "replica_unavailable"
        assert [e.num_calls for e in engines] == [1, 1, 0]  # the first dispatch and 1 re-dispatch
        [record] = gateway.telemetry()
        assert failed.value.response.headers["x-request-id"] == record["request_id"]  # nameable
        assert record["outcome"] == "failed" and record["num_dispatches"] == 2
        assert record["failed_replicas"] == ["a", "b"]
        assert gateway.usage(limit="100")["data"] == []


def test_with_no_other_replica_a_request_that_lost_its_replica_fails_at_once(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    engine = _fake(codec, "a", num_unreachable_calls=1)  # it would answer the next call: not waited for
    with _gateway(tmp_path, dev_checkpoint, [engine]) as gateway:
        with pytest.raises(openai.APIStatusError) as failed:
            gateway.client().completions.create(model=MODEL, prompt="hello", max_tokens=6, stream=True)
        assert failed.value.status_code == 503 and failed.value.code == "replica_unavailable"
        assert engine.num_calls == 1
        assert gateway.usage(limit="100")["data"] == []


def test_a_stream_that_loses_its_replica_mid_stream_ends_with_an_error_event_and_bills_its_tokens(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    engines = [_fake(codec, "a", lost_after=3), _fake(codec, "b")]
    with _gateway(tmp_path, dev_checkpoint, engines) as gateway:
        stream = gateway.client().completions.create(model=MODEL, prompt="hello", max_tokens=20, stream=True)
        request_id = ""
        with pytest.raises(openai.APIError, match="unavailable"):
            for chunk in stream:
                request_id = chunk.id
        assert [e.num_calls for e in engines] == [1, 0]  # it had sent output: not re-dispatched
        row = _billed_once(gateway, request_id)
        assert row["output_tokens"] == 3 and row["status"] == "failed"


def test_a_stream_whose_text_was_all_held_back_when_its_replica_was_lost_completes_on_another(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    # Two tokens ("abab") in, all of it a prefix of the stop string: held back, the client saw nothing.
    engines = [_fake(codec, "a", lost_after=2), _fake(codec, "b")]
    with _gateway(tmp_path, dev_checkpoint, engines) as gateway:
        stream = gateway.client().completions.create(
            model=MODEL,
            prompt="hello",
            max_tokens=6,
            stop=["ababababZ"],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == "ab" * 6  # b's 6 tokens only
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
        assert [e.num_calls for e in engines] == [1, 1]
        request_id = chunks[0].id
        row = _billed_once(gateway, request_id)
        assert row["output_tokens"] == 6 and row["status"] == "finished"  # not the 2 the client never saw
        [record] = [r for r in gateway.telemetry() if r["request_id"] == request_id]
        assert (
            record["num_dispatches"] == 2 and record["failed_replicas"] == ["a"] and record["replica"] == "b"
        )


def test_a_whole_answer_whose_replica_was_lost_mid_answer_completes_on_another_and_bills_that_answer(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    # Non-streaming: nothing goes back before the end, so 3 tokens in is still "nothing sent".
    engines = [_fake(codec, "a", lost_after=3), _fake(codec, "b")]
    with _gateway(tmp_path, dev_checkpoint, engines) as gateway:
        completion = gateway.client().completions.create(model=MODEL, prompt="hello", max_tokens=6)
        assert completion.choices[0].text == "ab" * 6  # b's answer alone, none of a's 3 tokens
        assert completion.usage is not None and completion.usage.completion_tokens == 6
        assert [e.num_calls for e in engines] == [1, 1]
        row = _billed_once(gateway, completion.id)
        assert row["output_tokens"] == 6 and row["status"] == "finished"
        [record] = [r for r in gateway.telemetry() if r["request_id"] == completion.id]
        assert record["num_dispatches"] == 2 and record["failed_replicas"] == ["a"]


def test_a_whole_answer_started_again_is_not_billed_the_lost_replicas_checkpoint_after_a_crash(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    """a checkpoints 64 tokens (the meter's every-64 rule), then is lost; while b answers, the outbox's
    latest checkpoint is 0: a gateway killed then bills b's output, not a's that nobody was sent."""
    engines = [_fake(codec, "a", lost_after=64), _fake(codec, "b", interval_s=0.02)]
    outbox = tmp_path / "outbox" / OUTBOX_FILE
    with _gateway(tmp_path, dev_checkpoint, engines) as gateway, ThreadPoolExecutor(1) as pool:
        answer = pool.submit(gateway.client().completions.create, model=MODEL, prompt="hello", max_tokens=80)
        seen: list[int] = []
        while not answer.done() and 0 not in seen:
            lines = [json.loads(raw) for raw in outbox.read_bytes().split(b"\n")[:-1]]  # whole lines only
            seen = [line["ckpt"]["output_tokens"] for line in lines if "ckpt" in line]
            time.sleep(0.01)
        assert seen[:2] == [64, 0], seen  # before b's first checkpoint (a second in)
        completion = answer.result(30)
        assert completion.usage is not None and completion.usage.completion_tokens == 80
        assert _billed_once(gateway, completion.id)["output_tokens"] == 80


def test_a_batch_line_whose_replica_was_lost_mid_answer_completes_on_another(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    engines = [_fake(codec, "a", lost_after=3), _fake(codec, "b")]
    with _gateway(
        tmp_path, dev_checkpoint, engines, batch_poll_interval_s=0.2, batch_flush_interval_s=0.2
    ) as gateway:
        client = gateway.client()
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 6}
        line = json.dumps({"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": body})
        upload = client.files.create(file=("in.jsonl", io.BytesIO(line.encode() + b"\n")), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
        )
        deadline = time.monotonic() + 30
        while (batch := client.batches.retrieve(batch.id)).status not in {"completed", "failed"}:
            assert time.monotonic() < deadline, batch.status
            time.sleep(0.1)
        assert batch.status == "completed" and batch.output_file_id is not None
        [out] = [json.loads(raw) for raw in client.files.content(batch.output_file_id).text.splitlines()]
        assert out["response"]["status_code"] == 200
        assert out["response"]["body"]["choices"][0]["text"] == "ab" * 6  # b's answer alone
        assert [e.num_calls for e in engines] == [1, 1]
        [record] = [r for r in gateway.telemetry() if r.get("batch_id") == batch.id]
        assert record["num_dispatches"] == 2 and record["failed_replicas"] == ["a"]
        [row] = [r for r in gateway.usage(limit="100")["data"] if r["request_id"].startswith(batch.id)]
        assert row["output_tokens"] == 6 and row["status"] == "finished"


def test_a_request_whose_replica_ran_its_prompt_is_billed_the_prompt_when_the_next_replica_is_unreachable(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    # a made 3 tokens nobody saw (not billed), then b could not be reached: a ran the prompt, so one row.
    engines = [_fake(codec, "a", lost_after=3), _fake(codec, "b", num_unreachable_calls=1)]
    with _gateway(tmp_path, dev_checkpoint, engines) as gateway:
        with pytest.raises(openai.APIStatusError) as failed:
            gateway.client().completions.create(model=MODEL, prompt="hello", max_tokens=6)
        assert failed.value.status_code == 503 and failed.value.code == "replica_unavailable"
        assert [e.num_calls for e in engines] == [1, 1]
        [record] = gateway.telemetry()
        assert record["num_dispatches"] == 2 and record["failed_replicas"] == ["a", "b"]
        [row] = gateway.usage(limit="100")["data"]
        assert row["output_tokens"] == 0 and row["prompt_tokens"] > 0 and row["status"] == "failed"


def test_a_redispatched_request_that_finds_no_room_before_its_deadline_fails_with_the_replicas_error(
    tmp_path: Path, dev_checkpoint: Path, codec: TextCodec
) -> None:
    full = _fake(codec, "a")  # reports more requests waiting than the gateway lets wait: its gate is shut
    full.stats = ReplicaStats(num_kv_tokens_total=4096, num_kv_tokens_free=4096, num_waiting=5, num_running=4)
    lost = _fake(codec, "b", num_unreachable_calls=100)
    lost.reachable = False  # stays suspended
    with _gateway(
        tmp_path, dev_checkpoint, [full, lost], max_waiting_per_replica=4, request_deadline_s=1.0
    ) as gateway:
        began = time.monotonic()
        with pytest.raises(openai.APIStatusError) as failed:
            gateway.client().completions.create(model=MODEL, prompt="hello", max_tokens=6, stream=True)
        assert failed.value.status_code == 503 and failed.value.code == "replica_unavailable"
        assert 0.5 < time.monotonic() - began < 1.0 + 1.0  # it waited for room until its deadline
        assert lost.num_calls == 1 and full.num_calls == 0
        [record] = gateway.telemetry()
        assert record["num_dispatches"] == 1 and record["failed_replicas"] == ["b"]
        assert read_metric(gateway.base_url + "/metrics", "sluice_gateway_redispatches_total") == 1
        assert gateway.usage(limit="100")["data"] == []
