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
from sluice.engine_client import (
    Delta,
    EngineError,
    EngineErrorKind,
    EnginePriority,
    FinishReason,
    GenerateRequest,
    Guide,
    GuideKind,
    Sampling,
    trtllm_dialect,
)
from sluice.engine_client.dialects import Dialect
from sluice.engine_client.triton import TritonEngineClient

MODEL = "fake-trtllm"
VOCAB = 50  # the fake's (fake_trtllm_model.VOCAB)
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
    names = ("temperature", "top_p", "seed", "ignore_eos", "top_k", "repetition_penalty", "logit_bias")
    sampled = {k: kwargs.pop(k) for k in (*names, "guide", "logprobs", "n") if k in kwargs}
    fields: dict[str, Any] = {"cache_scope": "acme", "eos_token_ids": (45, 46), **kwargs}
    return GenerateRequest(
        f"fake-trtllm-{time.monotonic_ns()}", [1, 2, 3], Sampling(max_tokens, **sampled), **fields
    )


async def _all(deltas: AsyncGenerator[Delta, None]) -> list[Delta]:
    async with aclosing(deltas):
        return [d async for d in deltas]


def _expected(last_prompt_token: int, num_tokens: int, answer: int = 0) -> list[int]:
    tokens, token = [], last_prompt_token
    for _ in range(num_tokens):
        token = (token * 7 + 3 + answer) % 50
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
        {"temperature": 0.7, "top_k": 5, "repetition_penalty": 1.3},
        {"logit_bias": ((3, 1.0), (7, -2.0)), "vocab_size": VOCAB},
        {"guide": Guide(GuideKind.JSON)},
        {"guide": Guide(GuideKind.JSON_SCHEMA, '{"type": "object"}'), "logprobs": 0},
        {"guide": Guide(GuideKind.REGEX, "[a-z]+")},
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


def test_log_probabilities_come_with_each_token(aio: Aio, client: TritonEngineClient) -> None:
    """The backend sends all of an answer's log-probabilities so far with each response; each delta gets
    its own tokens' (the fake's log-probability of token t is -(t + 1) / 100)."""
    deltas = aio(_all(client.generate(_request(4, ignore_eos=True, temperature=0.7, logprobs=0))))
    tokens = [t for d in deltas for t in d.token_ids]
    assert tokens == _expected(3, 4)
    for delta in deltas[:-1]:
        assert delta.logprobs is not None and len(delta.logprobs) == len(delta.token_ids)
    got = [lp.logprob for d in deltas for lp in d.logprobs or ()]
    assert got == pytest.approx([-(t + 1) / 100 for t in tokens])
    assert deltas[-1].finish_reason is FinishReason.LENGTH


def test_n_2_is_two_answers_told_apart_by_index_each_with_its_final_delta(
    aio: Aio, client: TritonEngineClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """num_return_sequences as a release that carries it (TensorRT-LLM 1.2.0 does not: the dialect refuses
    n > 1 there); the decoder reads sequence_index."""
    monkeypatch.setattr(trtllm_dialect, "NUM_RETURN_SEQUENCES_CARRIED", True)
    deltas = aio(_all(client.generate(_request(3, ignore_eos=True, temperature=0.7, n=2, logprobs=0))))
    for index in (0, 1):
        mine = [d for d in deltas if d.index == index]
        assert [t for d in mine for t in d.token_ids] == _expected(3, 3, index)
        assert [d.finish_reason for d in mine] == [None, None, None, FinishReason.LENGTH]
        assert [lp.logprob for d in mine for lp in d.logprobs or ()] == pytest.approx(
            [-(t + 1) / 100 for t in _expected(3, 3, index)]
        )
    assert {d.num_prompt_tokens for d in deltas if d.finish_reason} == {3}


def test_n_2_is_refused_on_the_pinned_release_before_anything_is_sent(
    aio: Aio, client: TritonEngineClient
) -> None:
    with pytest.raises(EngineError, match="n > 1") as err:
        aio(_all(client.generate(_request(3, temperature=0.7, n=2))))
    assert err.value.kind is EngineErrorKind.INVALID_REQUEST


def test_a_logit_bias_of_minus_100_keeps_its_token_out(aio: Aio, client: TritonEngineClient) -> None:
    banned = _expected(3, 1)[0]  # the fake's first token from this prompt
    request = _request(4, ignore_eos=True, logit_bias=((banned, -100.0),), vocab_size=VOCAB)
    tokens = [t for d in aio(_all(client.generate(request))) for t in d.token_ids]
    assert len(tokens) == 4 and banned not in tokens


def test_an_embedding_bias_of_another_length_than_the_vocabulary_fails_in_the_engine(
    aio: Aio, client: TritonEngineClient
) -> None:
    """The backend's decoder checks the length against the model's vocabulary: the gateway's vocab_size
    must be the model's (config.json), not the tokenizer's."""
    request = _request(2, logit_bias=((3, 1.0),), vocab_size=VOCAB + 1)
    with pytest.raises(EngineError, match="embedding bias shape") as err:
        aio(_all(client.generate(request)))
    assert err.value.kind is EngineErrorKind.ENGINE_ERROR
