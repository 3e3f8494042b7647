"""One contract, every ``EngineClient``: the in-process engine and Triton over gRPC (a real tritonserver)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from metrics_text import used_kv_blocks

from cpu_engine.client import InProcessEngineClient
from replicas.launcher import TritonServer
from sluice.engine_client import (
    Delta,
    EngineClient,
    EngineError,
    EngineErrorKind,
    FinishReason,
    GenerateRequest,
    Sampling,
)
from sluice.engine_client.triton import TritonEngineClient

MODEL = "sluice-tiny"
PROMPT = [int(t) for t in np.random.default_rng(11).integers(3, 8192, 30)]
Aio = Callable[[Coroutine[Any, Any, Any]], Any]


@dataclass
class Subject:
    client: EngineClient
    used_blocks: Callable[[], float]


@pytest.fixture(scope="module", params=["inprocess", "triton"])
def subject(request: pytest.FixtureRequest, aio: Aio, dev_checkpoint: Path) -> Iterator[Subject]:
    if request.param == "inprocess":
        inproc = InProcessEngineClient(dev_checkpoint, MODEL)
        aio(inproc.start())

        def used() -> float:
            assert inproc.engine_thread is not None
            return inproc.engine_thread.stats().kv_cache_block_metrics()["used"]

        yield Subject(inproc, used)
        aio(inproc.close())
    else:
        replica: TritonServer = request.getfixturevalue("replica")
        triton = TritonEngineClient(replica.grpc_url, MODEL, metrics_url=replica.metrics_url)
        aio(triton.start())
        yield Subject(triton, lambda: used_kv_blocks(replica.metrics_url))
        aio(triton.close())


def _request(max_tokens: int, **kwargs: Any) -> GenerateRequest:
    sampled = {k: kwargs.pop(k) for k in ("temperature", "top_p", "seed") if k in kwargs}
    sampling = Sampling(max_tokens, ignore_eos=True, **sampled)
    return GenerateRequest(f"contract-{time.monotonic_ns()}", PROMPT, sampling, cache_scope="acme", **kwargs)


async def _all(deltas: AsyncGenerator[Delta, None]) -> list[Delta]:
    async with aclosing(deltas):
        return [d async for d in deltas]


def test_ready_and_model_loaded(aio: Aio, subject: Subject) -> None:
    assert aio(subject.client.ready())
    assert aio(subject.client.model_loaded(MODEL))
    assert not aio(subject.client.model_loaded("no-such-model"))


def test_greedy_generation_streams_every_token_and_finishes_once(aio: Aio, subject: Subject) -> None:
    deltas = aio(_all(subject.client.generate(_request(20))))
    assert sum(len(d.token_ids) for d in deltas) == 20
    assert [d.finish_reason for d in deltas[:-1]] == [None] * (len(deltas) - 1)
    assert deltas[-1].finish_reason is FinishReason.LENGTH and deltas[-1].num_prompt_tokens == len(PROMPT)
    again = aio(_all(subject.client.generate(_request(20))))
    assert [t for d in again for t in d.token_ids] == [t for d in deltas for t in d.token_ids]


def test_stop_token_ids_end_with_stop(aio: Aio, subject: Subject) -> None:
    tokens = [t for d in aio(_all(subject.client.generate(_request(12)))) for t in d.token_ids]
    deltas = aio(_all(subject.client.generate(_request(12, stop_token_ids=(tokens[4],)))))
    assert [t for d in deltas for t in d.token_ids] == tokens[: tokens.index(tokens[4]) + 1]
    assert deltas[-1].finish_reason is FinishReason.STOP


def test_a_tiny_positive_temperature_is_greedy(aio: Aio, subject: Subject) -> None:
    """1e-310 once overflowed the in-process sampler to NaN and failed every sequence of the step."""
    greedy = [t for d in aio(_all(subject.client.generate(_request(12)))) for t in d.token_ids]
    for temperature in (1e-310, 1e-30):
        deltas = aio(_all(subject.client.generate(_request(12, temperature=temperature, top_p=0.9))))
        assert [t for d in deltas for t in d.token_ids] == greedy


def test_a_tiny_top_p_keeps_only_the_most_likely_token(aio: Aio, subject: Subject) -> None:
    """1e-300 rounds to 0 in Triton's FP32 input, which would mean "no cut": the whole distribution."""
    greedy = [t for d in aio(_all(subject.client.generate(_request(12)))) for t in d.token_ids]
    deltas = aio(_all(subject.client.generate(_request(12, temperature=1.0, top_p=1e-300, seed=0))))
    assert [t for d in deltas for t in d.token_ids] == greedy


def test_an_out_of_vocabulary_prompt_is_an_invalid_request(aio: Aio, subject: Subject) -> None:
    bad = GenerateRequest("contract-bad", [5, 10**6], Sampling(4), cache_scope="acme")
    with pytest.raises(EngineError) as err:
        aio(_all(subject.client.generate(bad)))
    assert err.value.kind is EngineErrorKind.INVALID_REQUEST


def test_closing_the_generator_early_frees_the_sequence_within_a_second(aio: Aio, subject: Subject) -> None:
    async def two_deltas_then_leave() -> int:
        deltas = subject.client.generate(_request(1500))
        async with aclosing(deltas):
            num_tokens = 0
            async for delta in deltas:
                num_tokens += len(delta.token_ids)
                if num_tokens >= 2:
                    break
            await asyncio.sleep(0.1)  # let the engine's stats see the live sequence
            assert subject.used_blocks() > 0
            return num_tokens

    assert aio(two_deltas_then_leave()) >= 2
    deadline = time.monotonic() + 1.0
    while subject.used_blocks() > 0:
        assert time.monotonic() < deadline, "the sequence outlived its cancelled call by a second"
        time.sleep(0.02)


def test_replica_stats_report_the_kv_pool_and_its_use(aio: Aio, subject: Subject) -> None:
    idle = aio(subject.client.replica_stats())
    assert idle is not None and idle.num_kv_tokens_total > 0 and idle.num_waiting >= 0
    assert idle.num_kv_tokens_free <= idle.num_kv_tokens_total

    async def while_generating() -> tuple[int, int]:
        async with aclosing(subject.client.generate(_request(200))) as deltas:
            async for delta in deltas:
                if delta.token_ids:
                    break
            for _ in range(100):  # the replica's metrics refresh on their own period
                busy = await subject.client.replica_stats()
                assert busy is not None
                if busy.num_running >= 1 and busy.num_kv_tokens_free < busy.num_kv_tokens_total:
                    return busy.num_running, busy.num_kv_tokens_free
                await asyncio.sleep(0.02)
        raise AssertionError("the replica never reported the running request")

    num_running, free = aio(while_generating())
    assert num_running >= 1 and free < idle.num_kv_tokens_total
