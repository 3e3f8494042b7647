"""The ``tensorrt_llm`` dialect end to end over a real tritonserver, serving the config.pbtxt that
build_engines renders for TensorRT-LLM with a named fake model behind it (``fake_trtllm_model.py``: no GPU,
no TensorRT-LLM here). Triton checks each request's tensors against that declaration itself, so a name,
dtype or shape the backend would refuse fails here; the fake answers as the backend does (no finish
reason, the last response flagged final), so the client's deltas must end with one."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import AsyncGenerator, Callable, Coroutine, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from ports import free_ports

from build_engines.repository import render_trtllm, write_repository
from replicas.launcher import TritonServer, TritonServerConfig
from sluice.engine_client import Delta, EngineError, EnginePriority, FinishReason, GenerateRequest, Sampling
from sluice.engine_client.dialects import Dialect
from sluice.engine_client.triton import TritonEngineClient

MODEL = "fake-trtllm"
DIGEST = "sha256:" + "0" * 64
Aio = Callable[[Coroutine[Any, Any, Any]], Any]


@pytest.fixture(scope="module")
def fake_replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    repo = tmp_path_factory.mktemp("trtllm_repository")
    files = render_trtllm(
        model_name=MODEL, triton_version=1, engine_dir="/none", weights_digest_value=DIGEST, max_batch_size=8
    )
    config = files[f"{MODEL}/config.pbtxt"]
    assert 'backend: "tensorrtllm"' in config
    files[f"{MODEL}/config.pbtxt"] = config.replace('backend: "tensorrtllm"', 'backend: "python"')
    model_dir = write_repository(repo, files, MODEL, 1)
    shutil.copy(Path(__file__).with_name("fake_trtllm_model.py"), model_dir / "1" / "model.py")
    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        TritonServerConfig(
            model_repository=repo,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            state_dir=tmp_path_factory.mktemp("trtllm_state"),
            shm_prefix=f"sluice_test_{os.getpid()}_trtllm_",
            exit_timeout_s=1,
            stop_timeout_s=10,
        )
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(aio: Aio, fake_replica: TritonServer) -> Iterator[TritonEngineClient]:
    engine = TritonEngineClient(fake_replica.grpc_url, MODEL, dialect=Dialect.TENSORRT_LLM)
    aio(engine.start())
    yield engine
    aio(engine.close())


def _request(max_tokens: int, **kwargs: Any) -> GenerateRequest:
    sampled = {k: kwargs.pop(k) for k in ("temperature", "top_p", "seed", "ignore_eos") if k in kwargs}
    fields: dict[str, Any] = {"cache_scope": "acme", "eos_token_ids": (45, 46), **kwargs}
    return GenerateRequest(
        f"fake-trtllm-{time.monotonic_ns()}", [1, 2, 3], Sampling(max_tokens, **sampled), **fields
    )


async def _all(deltas: AsyncGenerator[Delta, None]) -> list[Delta]:
    async with aclosing(deltas):
        return [d async for d in deltas]


def _expected(last_prompt_token: int, num_tokens: int) -> list[int]:
    tokens, token = [], last_prompt_token
    for _ in range(num_tokens):
        token = (token * 7 + 3) % 50
        tokens.append(token)
    return tokens


def test_a_stream_that_reaches_max_tokens_ends_with_length(aio: Aio, client: TritonEngineClient) -> None:
    deltas = aio(_all(client.generate(_request(4, ignore_eos=True))))
    assert [t for d in deltas for t in d.token_ids] == _expected(3, 4)
    assert [d.finish_reason for d in deltas] == [None] * 4 + [FinishReason.LENGTH]
    assert deltas[-1].token_ids == [] and deltas[-1].num_prompt_tokens == 3


def test_a_stream_that_meets_its_end_id_ends_with_stop(aio: Aio, client: TritonEngineClient) -> None:
    # from 3: 24, 21, 0, 3, 24, ... never 45; end_id is the first token the fake would produce next
    first = _expected(3, 1)[0]
    deltas = aio(_all(client.generate(_request(10, eos_token_ids=(first,)))))
    assert [t for d in deltas for t in d.token_ids] == []
    assert deltas[-1].finish_reason is FinishReason.STOP


def test_a_stop_id_ends_the_stream_with_stop(aio: Aio, client: TritonEngineClient) -> None:
    expected = _expected(3, 3)
    deltas = aio(_all(client.generate(_request(10, stop_token_ids=(expected[2],)))))
    assert [t for d in deltas for t in d.token_ids] == expected
    assert deltas[-1].finish_reason is FinishReason.STOP


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.7, "top_p": 0.9, "seed": 2**63 + 1},
        {"temperature": 1.0, "top_p": 1e-12},
        {"priority": EnginePriority.BATCH, "cache_scope": "globex"},
        {"stop_token_ids": (11, 12), "ignore_eos": True},
    ],
)
def test_triton_accepts_every_tensor_the_dialect_sends(
    aio: Aio, client: TritonEngineClient, kwargs: dict[str, Any]
) -> None:
    deltas = aio(_all(client.generate(_request(2, **kwargs))))
    assert deltas[-1].finish_reason is not None


def test_the_cpu_engine_tensors_are_refused_by_the_tensorrt_llm_model(
    aio: Aio, fake_replica: TritonServer
) -> None:
    """Why the dialect exists: Triton refuses the CPU engine's inputs (cache_scope, priority...) here."""
    engine = TritonEngineClient(fake_replica.grpc_url, MODEL)  # the cpu_engine dialect
    aio(engine.start())
    try:
        with pytest.raises(EngineError, match=r"cache_scope|priority|unexpected inference input"):
            aio(_all(engine.generate(_request(2))))
    finally:
        aio(engine.close())
