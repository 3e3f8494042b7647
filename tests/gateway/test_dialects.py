"""The request dialects against the model configurations Sluice renders (no TensorRT-LLM server here: no
GPU). Every tensor a dialect builds must be an input the rendered config.pbtxt declares, with its data
type and rank (one more than ``dims``: the batch dimension), and every required input must be sent;
Triton rejects anything else before the model sees it. Plus the response side of ``tensorrt_llm``:
canned responses to ``Delta``s, the last with a finish reason the backend never sends."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from google.protobuf.json_format import MessageToJson
from tritonclient.grpc import model_config_pb2, service_pb2
from tritonclient.utils import np_to_triton_dtype

from build_engines.repository import render_cpu, render_llmapi, render_trtllm
from gateway.routing.pools import unservable
from gateway.routing.table import ReplicaTarget, RoutingTable
from replicas.render import CpuEngineModelSettings
from replicas.verify import served_digest
from sluice.engine_client import (
    Delta,
    EnginePriority,
    FinishReason,
    GenerateRequest,
    Sampling,
    trtllm_dialect,
)
from sluice.engine_client.dialects import Dialect, build_tensors, dialect_of
from sluice.engine_client.trtllm_dialect import TrtllmDecoder, stop_words_list
from sluice.stores.registry.base import (
    Model,
    ModelVersion,
    RegistrySnapshot,
    Replica,
    ReplicaState,
    Route,
    RouteEntry,
    VersionState,
)
from sluice.triton.client import request_tensors
from sluice.wire import EngineError, EngineErrorKind, Guide, GuideKind

DIGEST = "sha256:" + "0" * 64
PROMPT = [5, 17, 99, 4]
EOS = (2, 7)  # a model with two end-of-sequence ids (Llama 3 has two)


@dataclass(frozen=True)
class Declared:
    data_type: str  # tritonclient's spelling: INT32, BOOL, BYTES...
    dims: tuple[int, ...]
    optional: bool


def _inputs(config_text: str) -> tuple[int, dict[str, Declared]]:
    config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    inputs = {}
    for tensor in config.input:
        name = model_config_pb2.DataType.Name(tensor.data_type).removeprefix("TYPE_")
        inputs[tensor.name] = Declared(
            "BYTES" if name == "STRING" else name, tuple(tensor.dims), tensor.optional
        )
    return config.max_batch_size, inputs


@pytest.fixture(scope="module")
def trtllm_config() -> tuple[int, dict[str, Declared]]:
    files = render_trtllm(
        model_name="m", triton_version=1, engine_dir="/e", weights_digest_value=DIGEST, max_batch_size=8
    )
    return _inputs(files["m/config.pbtxt"])


@pytest.fixture(scope="module")
def cpu_config() -> tuple[int, dict[str, Declared]]:
    files = render_cpu(CpuEngineModelSettings(Path("/ckpt"), model_name="m", weights_digest=DIGEST))
    return _inputs(files["m/config.pbtxt"])


def _request(**kwargs: object) -> GenerateRequest:
    names = ("temperature", "top_p", "seed", "ignore_eos", "top_k", "min_p", "presence_penalty")
    names += ("frequency_penalty", "repetition_penalty", "logit_bias", "guide", "logprobs", "n")
    sampled = {k: kwargs.pop(k) for k in names if k in kwargs}
    max_tokens = kwargs.pop("max_tokens", 16)
    fields: dict[str, object] = {"cache_scope": "acme", "eos_token_ids": EOS, **kwargs}
    return GenerateRequest("r", PROMPT, Sampling(max_tokens, **sampled), **fields)  # type: ignore[arg-type]


REQUESTS = {
    "greedy": _request(),
    "sampled": _request(temperature=0.7, top_p=0.9),
    "sampled without top_p": _request(temperature=1.3),
    "tiny top_p": _request(temperature=1.0, top_p=1e-12),
    "seed": _request(temperature=0.7, seed=2**63 + 5),
    "stop ids": _request(stop_token_ids=(11, 12)),
    "stop ids and an eos id among them": _request(stop_token_ids=(7, 12)),
    "ignore_eos": _request(ignore_eos=True),
    "ignore_eos with stop ids": _request(ignore_eos=True, stop_token_ids=(11,)),
    **{f"priority {p.name}": _request(priority=p) for p in EnginePriority},
    "another tenant": _request(cache_scope="globex"),
}


def _check_against(
    tensors: Mapping[str, np.ndarray], max_batch_size: int, declared: Mapping[str, Declared]
) -> None:
    assert max_batch_size > 0  # so every tensor carries a batch dimension of 1
    for name, array in tensors.items():
        assert name in declared, f"{name} is not an input of the model"
        spec = declared[name]
        assert np_to_triton_dtype(array.dtype) == spec.data_type, name
        assert array.ndim == len(spec.dims) + 1 and array.shape[0] == 1, (name, array.shape, spec.dims)
        for sent, want in zip(array.shape[1:], spec.dims, strict=True):
            assert want == -1 or sent == want, (name, array.shape, spec.dims)
    missing = {name for name, spec in declared.items() if not spec.optional} - set(tensors)
    assert not missing, f"required inputs not sent: {missing}"


@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_tensorrt_llm_tensors_are_inputs_the_rendered_model_declares(
    case: str, trtllm_config: tuple[int, dict[str, Declared]]
) -> None:
    _check_against(build_tensors(Dialect.TENSORRT_LLM, REQUESTS[case]), *trtllm_config)


@pytest.mark.parametrize("case", sorted(REQUESTS))
def test_cpu_engine_tensors_are_inputs_the_rendered_model_declares(
    case: str, cpu_config: tuple[int, dict[str, Declared]]
) -> None:
    _check_against(build_tensors(Dialect.CPU_ENGINE, REQUESTS[case]), *cpu_config)


def test_the_cpu_engine_tensors_are_what_the_tensorrt_llm_model_would_reject(
    trtllm_config: tuple[int, dict[str, Declared]],
) -> None:
    """Why dialects exist, and proof the check above can fail: priority (and cache_scope) are no inputs."""
    with pytest.raises(AssertionError, match="priority is not an input"):
        _check_against(build_tensors(Dialect.CPU_ENGINE, REQUESTS["greedy"]), *trtllm_config)


def test_the_cpu_engine_wire_is_what_it_was() -> None:
    """The cpu_engine dialect sends exactly the tensors the client sent before dialects (eos ids not)."""
    request = _request(temperature=0.5, top_p=1e-9, seed=3, stop_token_ids=(9,), priority=2, ignore_eos=True)
    before = request_tensors(
        PROMPT, 16, streaming=True, temperature=0.5, top_p=1e-6, seed=3, stop_token_ids=(9,), priority=2,
        cache_scope="acme", ignore_eos=True,
    )  # fmt: skip
    sent = build_tensors(Dialect.CPU_ENGINE, request)
    assert sent.keys() == before.keys()
    for name, array in before.items():  # object arrays (the BYTES tenant) compare by value, not pointer
        assert sent[name].dtype == array.dtype and sent[name].tolist() == array.tolist(), name


CONTROLS = {
    "top_k and min_p": _request(temperature=0.7, top_k=5, min_p=0.1),
    "penalties": _request(presence_penalty=0.5, frequency_penalty=-0.2, repetition_penalty=1.2),
    "logit_bias": _request(logit_bias=((3, 2.5), (7, -100.0))),
}


@pytest.mark.parametrize("case", sorted(CONTROLS))
def test_the_sampling_controls_are_cpu_engine_inputs(
    case: str, cpu_config: tuple[int, dict[str, Declared]]
) -> None:
    _check_against(build_tensors(Dialect.CPU_ENGINE, CONTROLS[case]), *cpu_config)


def test_the_cpu_engine_sends_each_control_and_leaves_out_the_off_ones() -> None:
    sent = build_tensors(Dialect.CPU_ENGINE, CONTROLS["penalties"])
    assert (_scalar(sent, "presence_penalty"), _scalar(sent, "repetition_penalty")) == (
        0.5,
        pytest.approx(1.2),
    )
    assert "min_p" not in sent and "logit_bias_ids" not in sent
    bias = build_tensors(Dialect.CPU_ENGINE, CONTROLS["logit_bias"])
    assert bias["logit_bias_ids"].tolist() == [[3, 7]] and bias["logit_bias_values"].tolist() == [
        [2.5, -100.0]
    ]
    cut = build_tensors(Dialect.CPU_ENGINE, CONTROLS["top_k and min_p"])
    assert (_scalar(cut, "runtime_top_k"), _scalar(cut, "min_p")) == (5, pytest.approx(0.1))


def _scalar(tensors: Mapping[str, np.ndarray], name: str) -> Any:
    return tensors[name].reshape(-1)[0].item()


def test_tensorrt_llm_maps_sampling_seed_and_stops_onto_the_backends_names() -> None:
    greedy = build_tensors(Dialect.TENSORRT_LLM, REQUESTS["greedy"])
    assert _scalar(greedy, "runtime_top_k") == 1 and "temperature" not in greedy
    assert (_scalar(greedy, "end_id"), _scalar(greedy, "input_lengths")) == (2, 4)
    # the second EOS id can only be a stop word: the backend takes one end_id
    assert greedy["stop_words_list"].tolist() == [[[7], [1]]]
    sampled = build_tensors(Dialect.TENSORRT_LLM, REQUESTS["seed"])
    assert _scalar(sampled, "seed") == 2**63 + 5 and sampled["seed"].dtype == np.uint64
    assert _scalar(sampled, "runtime_top_k") == 0 and _scalar(sampled, "runtime_top_p") == 1.0
    tiny = build_tensors(Dialect.TENSORRT_LLM, REQUESTS["tiny top_p"])
    assert _scalar(tiny, "runtime_top_p") > 0  # 0 would be the backend's "no cut"
    stops = build_tensors(Dialect.TENSORRT_LLM, REQUESTS["stop ids and an eos id among them"])
    assert stops["stop_words_list"].tolist() == [[[7, 12], [1, 2]]]


def test_tensorrt_llm_ignore_eos_sends_no_end_id_but_keeps_the_stop_ids() -> None:
    tensors = build_tensors(Dialect.TENSORRT_LLM, REQUESTS["ignore_eos with stop ids"])
    assert "end_id" not in tensors and "pad_id" not in tensors
    assert tensors["stop_words_list"].tolist() == [[[11], [1]]]


def test_tensorrt_llm_without_eos_ids_fails_loudly_instead_of_never_stopping() -> None:
    with pytest.raises(EngineError, match="eos_token_ids"):
        build_tensors(Dialect.TENSORRT_LLM, _request(eos_token_ids=()))


def test_what_tensorrt_llm_cannot_carry_is_not_sent() -> None:
    """No priority and no tenant scope: the backend declares neither (so its KV reuse is rendered off)."""
    for case in ("priority BATCH", "another tenant"):
        sent = build_tensors(Dialect.TENSORRT_LLM, REQUESTS[case])
        assert sent.keys() == build_tensors(Dialect.TENSORRT_LLM, REQUESTS["greedy"]).keys()
    files = render_trtllm(
        model_name="m", triton_version=1, engine_dir="/e", weights_digest_value=DIGEST, max_batch_size=8
    )
    config = text_format.Parse(files["m/config.pbtxt"], model_config_pb2.ModelConfig())
    assert config.parameters["enable_kv_cache_reuse"].string_value == "false"


def test_stop_words_list_is_the_backends_sparse_form() -> None:
    assert stop_words_list((5, 6, 7)).tolist() == [[[5, 6, 7], [1, 2, 3]]]


def _response(token_ids: list[int]) -> dict[str, np.ndarray | None]:
    """One tensorrt_llm response as the backend fills it: one beam, this response's tokens."""
    return {
        "output_ids": np.asarray(token_ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(token_ids)]], dtype=np.int32),
    }


def _decode(request: GenerateRequest, responses: list[list[int]]) -> list[Delta]:
    decoder = TrtllmDecoder(request)
    return [decoder.on_response(_response(ids)) for ids in responses] + decoder.on_end()


def test_a_tensorrt_llm_stream_that_reached_max_tokens_ends_with_length() -> None:
    deltas = _decode(_request(max_tokens=3), [[40], [41], [42]])
    assert [d.token_ids for d in deltas] == [[40], [41], [42], []]
    assert [d.finish_reason for d in deltas] == [None, None, None, FinishReason.LENGTH]
    assert (deltas[-1].num_prompt_tokens, deltas[-1].num_cached_tokens) == (4, None)


def test_a_tensorrt_llm_stream_that_ended_early_ends_with_stop() -> None:
    deltas = _decode(_request(), [[40, 41], [2]])  # two tokens in one response (speculative steps)
    assert [d.token_ids for d in deltas] == [[40, 41], [2], []]
    assert deltas[-1].finish_reason is FinishReason.STOP


def test_only_the_sequence_length_of_output_ids_is_read() -> None:
    padded = {"output_ids": np.array([[[40, -1, -1]]], dtype=np.int32), "sequence_length": np.array([[1]])}
    assert TrtllmDecoder(_request()).on_response(padded).token_ids == [40]


# issue 25's controls on the tensorrt_llm dialect (sluice/engine_client/trtllm_dialect.py's table).
VOCAB = 16
TRTLLM_REQUESTS = {
    "top_k": _request(temperature=0.7, top_k=5),
    "top_k past the vocabulary": _request(temperature=0.7, top_k=5000, vocab_size=VOCAB),
    "repetition_penalty": _request(repetition_penalty=1.2),
    "logit_bias": _request(logit_bias=((3, 2.5), (7, -100.0)), vocab_size=VOCAB),
    "json": _request(guide=Guide(GuideKind.JSON)),
    "json_schema": _request(guide=Guide(GuideKind.JSON_SCHEMA, '{"type": "string"}')),
    "regex": _request(guide=Guide(GuideKind.REGEX, "[a-z]+")),
    "logprobs": _request(temperature=0.7, logprobs=0),
    "everything": _request(
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        seed=1,
        repetition_penalty=0.9,
        logprobs=0,
        logit_bias=((0, 1.0),),
        vocab_size=VOCAB,
        guide=Guide(GuideKind.REGEX, "a+"),
        stop_token_ids=(9,),
    ),
}


@pytest.mark.parametrize("case", sorted(TRTLLM_REQUESTS))
def test_tensorrt_llm_sends_each_new_control_as_an_input_the_rendered_model_declares(
    case: str, trtllm_config: tuple[int, dict[str, Declared]]
) -> None:
    _check_against(build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS[case]), *trtllm_config)


def test_tensorrt_llm_maps_top_k_repetition_penalty_and_logprobs() -> None:
    sent = build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["top_k"])
    assert _scalar(sent, "runtime_top_k") == 5 and "repetition_penalty" not in sent
    assert (
        _scalar(
            build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["top_k past the vocabulary"]), "runtime_top_k"
        )
        == 0
    )
    penalty = build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["repetition_penalty"])
    assert penalty["repetition_penalty"].dtype == np.float32
    assert _scalar(penalty, "repetition_penalty") == pytest.approx(1.2)
    assert _scalar(penalty, "runtime_top_k") == 1  # greedy keeps its penalty
    logprobs = build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["logprobs"])
    assert _scalar(logprobs, "return_log_probs") is True and logprobs["return_log_probs"].dtype == np.bool_
    assert "return_log_probs" not in build_tensors(Dialect.TENSORRT_LLM, REQUESTS["sampled"])
    assert "num_return_sequences" not in logprobs


def test_tensorrt_llm_sends_logit_bias_as_a_dense_embedding_bias_over_the_vocabulary() -> None:
    bias = build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["logit_bias"])["embedding_bias"]
    assert bias.dtype == np.float32 and bias.shape == (1, VOCAB)
    expected = np.zeros(VOCAB, dtype=np.float32)
    expected[3], expected[7] = 2.5, -100.0
    assert bias.reshape(-1).tolist() == expected.tolist()
    with pytest.raises(EngineError, match=r"logit_bias token ids must be in \[0, 16\)") as out_of_range:
        build_tensors(Dialect.TENSORRT_LLM, _request(logit_bias=((16, 1.0),), vocab_size=VOCAB))
    assert out_of_range.value.kind is EngineErrorKind.INVALID_REQUEST
    # Without the model's vocabulary size the vector cannot be built: the gateway's bug, not the caller's.
    with pytest.raises(EngineError, match="vocab_size") as unknown:
        build_tensors(Dialect.TENSORRT_LLM, _request(logit_bias=((3, 1.0),)))
    assert unknown.value.kind is EngineErrorKind.ENGINE_ERROR


def _text(tensors: Mapping[str, np.ndarray], name: str) -> str:
    return str(tensors[name].reshape(-1)[0].decode())


def test_tensorrt_llm_sends_guides_under_the_backends_guide_types() -> None:
    json_object = build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["json"])
    # OpenAI's json_object is an object; the backend's "json" is any JSON value: sent as a schema.
    assert _text(json_object, "guided_decoding_guide_type") == "json_schema"
    assert json.loads(_text(json_object, "guided_decoding_guide")) == {"type": "object"}
    schema = build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["json_schema"])
    assert (_text(schema, "guided_decoding_guide_type"), _text(schema, "guided_decoding_guide")) == (
        "json_schema",
        '{"type": "string"}',
    )
    regex = build_tensors(Dialect.TENSORRT_LLM, TRTLLM_REQUESTS["regex"])
    assert (_text(regex, "guided_decoding_guide_type"), _text(regex, "guided_decoding_guide")) == (
        "regex",
        "[a-z]+",
    )
    assert regex["guided_decoding_guide"].dtype == np.object_ and regex["guided_decoding_guide"].shape == (
        1,
        1,
    )


REFUSED = {
    "min_p": (_request(temperature=0.7, min_p=0.1), "min_p"),
    "presence_penalty": (_request(presence_penalty=0.5), "presence_penalty.*prompt"),
    "frequency_penalty": (_request(frequency_penalty=-0.2), "frequency_penalty.*prompt"),
    "n": (_request(temperature=0.7, n=2), r"n > 1.*num_return_sequences.*no_repeat_ngram_size"),
    "top_logprobs": (_request(logprobs=3), "top_logprobs.*alternatives"),
    "top_k above 1024": (_request(temperature=0.7, top_k=1025, vocab_size=50_000), "top_k above 1024"),
    "top_k above 1024, vocabulary unknown": (_request(temperature=0.7, top_k=5000), "top_k above 1024"),
    "ebnf_grammar": (_request(guide=Guide(GuideKind.EBNF_GRAMMAR, "start: /a+/")), "ebnf_grammar guide"),
    "guide with ignore_eos": (_request(guide=Guide(GuideKind.JSON), ignore_eos=True), "ignore_eos"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_tensorrt_llm_cannot_carry_is_refused_naming_the_parameter_and_why(case: str) -> None:
    request, why = REFUSED[case]
    with pytest.raises(EngineError, match="not supported by this model's engine \\(TensorRT-LLM\\)") as err:
        build_tensors(Dialect.TENSORRT_LLM, request)
    assert err.value.kind is EngineErrorKind.INVALID_REQUEST
    assert re.search(why, err.value.message), err.value.message


def test_greedy_ignores_the_cuts_tensorrt_llm_cannot_make_instead_of_refusing_them() -> None:
    """A greedy request takes the argmax: min_p and top_k cut nothing, so neither is sent nor refused."""
    sent = build_tensors(Dialect.TENSORRT_LLM, _request(min_p=0.2, top_k=5000))
    assert _scalar(sent, "runtime_top_k") == 1 and "min_p" not in sent


def test_n_is_num_return_sequences_once_the_release_carries_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trtllm_dialect, "NUM_RETURN_SEQUENCES_CARRIED", True)
    sent = build_tensors(Dialect.TENSORRT_LLM, _request(temperature=0.7, n=3))
    assert _scalar(sent, "num_return_sequences") == 3 and sent["num_return_sequences"].dtype == np.int32
    # Greedy with n > 1 is n identical answers: the caller's choice, not refused.
    assert _scalar(build_tensors(Dialect.TENSORRT_LLM, _request(n=2)), "num_return_sequences") == 2


def _with_logprobs(
    response: dict[str, np.ndarray | None], values: list[float]
) -> dict[str, np.ndarray | None]:
    return {**response, "output_log_probs": np.asarray(values, dtype=np.float32).reshape(1, 1, -1)}


def test_tensorrt_llm_log_probs_are_each_responses_tokens_of_the_answers_so_far() -> None:
    """The backend sends an answer's log-probabilities for all its tokens so far (createResult)."""
    decoder = TrtllmDecoder(_request(temperature=0.7, logprobs=0))
    first = decoder.on_response(_with_logprobs(_response([40, 41]), [-0.5, -1.5]))
    second = decoder.on_response(_with_logprobs(_response([42]), [-0.5, -1.5, -2.5]))
    assert [t.logprob for t in first.logprobs or ()] == [-0.5, -1.5]
    assert [t.logprob for t in second.logprobs or ()] == [-2.5]
    assert all(t.top == () for t in first.logprobs or ())  # no alternatives from this backend
    (final,) = decoder.on_end()
    assert final.finish_reason is FinishReason.STOP and final.logprobs == ()
    # Only this response's, as some builds send: read as such.
    only_new = TrtllmDecoder(_request(logprobs=0))
    only_new.on_response(_with_logprobs(_response([40]), [-0.25]))
    assert [
        t.logprob for t in only_new.on_response(_with_logprobs(_response([41]), [-0.75])).logprobs or ()
    ] == [-0.75]
    with pytest.raises(EngineError, match="output_log_probs") as short:
        TrtllmDecoder(_request(logprobs=0)).on_response(_with_logprobs(_response([40, 41, 42]), [-1.0]))
    assert short.value.kind is EngineErrorKind.ENGINE_ERROR
    assert TrtllmDecoder(_request()).on_response(_with_logprobs(_response([40]), [-1.0])).logprobs is None


def _of(response: dict[str, np.ndarray | None], index: int) -> dict[str, np.ndarray | None]:
    return {**response, "sequence_index": np.array([[index]], dtype=np.int32)}


def test_tensorrt_llm_answers_are_told_apart_by_sequence_index_and_each_ends_with_its_reason() -> None:
    decoder = TrtllmDecoder(_request(temperature=0.7, n=2, max_tokens=2))
    deltas = [
        decoder.on_response(_of(_response([40]), 0)),
        decoder.on_response(_of(_response([50]), 1)),
        decoder.on_response(_of(_response([41]), 0)),
        decoder.on_response(_of(_response([]), 1)),  # answer 1 met its end id
    ]
    assert [(d.index, d.token_ids) for d in deltas] == [(0, [40]), (1, [50]), (0, [41]), (1, [])]
    finals = decoder.on_end()
    assert [(d.index, d.finish_reason, d.num_prompt_tokens) for d in finals] == [
        (0, FinishReason.LENGTH, 4),
        (1, FinishReason.STOP, 4),
    ]
    assert decoder.num_generated_tokens == 3
    with pytest.raises(EngineError, match="answer 2") as err:
        decoder.on_response(_of(_response([1]), 2))
    assert err.value.kind is EngineErrorKind.ENGINE_ERROR


def test_dialect_follows_the_build_target() -> None:
    assert dialect_of(None) is dialect_of({}) is dialect_of({"target": "cpu"}) is Dialect.CPU_ENGINE
    assert dialect_of({"target": "trtllm", "dtype": "fp8"}) is Dialect.TENSORRT_LLM
    assert dialect_of({"target": "trtllm-llmapi"}) is Dialect.LLMAPI
    with pytest.raises(ValueError, match="unknown build target"):
        dialect_of({"target": "vllm"})


def test_replicas_of_a_model_the_client_cannot_speak_to_stay_out_of_rotation() -> None:
    def target(dialect: Dialect | None) -> ReplicaTarget:
        return ReplicaTarget("r", "127.0.0.1:1", "m", "1", DIGEST, dialect=dialect)

    assert unservable(target(Dialect.CPU_ENGINE)) is None
    assert unservable(target(Dialect.TENSORRT_LLM)) is None
    llmapi = unservable(target(Dialect.LLMAPI))
    assert llmapi is not None and not llmapi.ok and "text" in llmapi.detail
    unknown = unservable(target(None))
    assert unknown is not None and "unknown" in unknown.detail


def test_verify_reads_the_weights_digest_of_every_rendered_model() -> None:
    """As Triton's gRPC API returns a config (JSON of a ModelConfigResponse): the CPU engine's, the
    tensorrt_llm model's and the llmapi model's all carry the digest where verify reads it."""
    build_config = {
        "dtype": "bfloat16", "tp_size": 1, "max_batch_size": 8, "max_num_tokens": 4096, "max_seq_len": 2048,
        "max_input_len": 1024,
    }  # fmt: skip
    rendered = [
        render_cpu(CpuEngineModelSettings(Path("/ckpt"), model_name="m", weights_digest=DIGEST)),
        render_trtllm(
            model_name="m", triton_version=1, engine_dir="/e", weights_digest_value=DIGEST, max_batch_size=8
        ),
        render_llmapi(
            model_name="m", triton_version=1, checkpoint_dir="/c", weights_digest_value=DIGEST,
            build_config=build_config,
        ),
    ]  # fmt: skip
    for files in rendered:
        config = text_format.Parse(files["m/config.pbtxt"], model_config_pb2.ModelConfig())
        response = service_pb2.ModelConfigResponse(config=config)
        assert served_digest(json.loads(MessageToJson(response, preserving_proto_field_name=True))) == DIGEST
    assert served_digest({"config": {"parameters": {}}}) == ""


def test_the_routing_table_carries_each_versions_dialect() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    builds = {"1": {}, "2": {"target": "trtllm"}, "3": {"target": "trtllm-llmapi"}, "4": {"target": "new"}}
    snapshot = RegistrySnapshot(
        generation=3,
        models=(Model("m", "", now),),
        versions=tuple(
            ModelVersion("m", v, f"file:///{v}", DIGEST, build, VersionState.SERVING, now, now)
            for v, build in builds.items()
        ),
        replicas=tuple(
            Replica(f"r{v}", f"127.0.0.1:{9000 + int(v)}", "m", v, ReplicaState.READY, "", now, now, now)
            for v in builds
        ),
        routes=(Route("m", (RouteEntry("1", 10_000), *(RouteEntry(v, 0) for v in "234"))),),
    )
    table = RoutingTable.from_snapshot(snapshot)
    dialects = {r.version: r.dialect for r in table.replicas().values()}
    assert dialects == {"1": Dialect.CPU_ENGINE, "2": Dialect.TENSORRT_LLM, "3": Dialect.LLMAPI, "4": None}
    assert table.models["m"].versions["2"].dialect is Dialect.TENSORRT_LLM
