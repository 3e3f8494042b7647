"""The Triton repositories Sluice renders for TensorRT-LLM, held to the backend's own source, not to our
templates. Every fact below was read in NVIDIA/TensorRT-LLM (the release Sluice pins:
build_engines/trtllm_release.py) and names the file and function it came from. The copies read (this
project's source index; the 2.5 GB repository could not be fetched whole to check out the tag itself):

- triton_backend/inflight_batcher_llm/src/model_instance_state.cc   @ 0c8de69a1ca6
- triton_backend/inflight_batcher_llm/src/model_state.cc            @ 5cdd69218f88
- triton_backend/inflight_batcher_llm/src/utils.cc                  @ 192908136e53
- triton_backend/inflight_batcher_llm/src/utils.h                   @ 14c3afecc065
- triton_backend/all_models/llmapi/tensorrt_llm/1/model.py          @ 044a90d209e3
- triton_backend/all_models/llmapi/tensorrt_llm/1/helpers.py        @ 0df60f9ad779
- triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt        @ 0a71057313ec
- tensorrt_llm/llmapi/llm_args.py (BaseLlmArgs fields)
- triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt  @ 0c8de69a1ca6 (the shipped
  declarations of the inputs issue 25 added: dtypes and dims)
- cpp/tensorrt_llm/batch_manager/llmRequest.cpp                    @ 119c6e60e65e (createResult)
- cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp (xgrammar only in the C++ runtime; guide types)
- cpp/tensorrt_llm/batch_manager/createNewDecoderRequests.cpp      (embedding_bias length and dtype)
- cpp/tensorrt_llm/kernels/penaltyKernels.cu, samplingTopKKernels.h (what the penalties count; TOP_K_MAX)
- examples/generate_xgrammar_tokenizer_info.py and tensorrt_llm/llmapi/tokenizer.py
  (_xgrammar_tokenizer_info: the tokenizer info file guided decoding reads)
- NVIDIA/TensorRT-LLM#13633 (maintainers: on 1.2.0rc4 and 1.2.0 GA utils.cc passes 17 positional
  arguments to the 20-parameter SamplingConfig; every argument from lengthPenalty on lands one slot late)

Checked against every ``tensorrt_llm`` repository the CLI can produce (FP8 or not, tp/pp 1, 2, 4,
KV reuse on and off, the build's render and a replica's) and every llmapi one; and the gateway's
tensorrt_llm dialect against the input table. No GPU ran any of it: docs/operations.md says so.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from build_engines.checkpoint import CheckpointInfo
from build_engines.guided_decoding import XGRAMMAR_TOKENIZER_INFO
from build_engines.plan import plan_build
from build_engines.repository import TrtllmServing, render_for_replica, render_trtllm
from build_engines.spec import BuildSpec
from build_engines.trtllm_release import TRTLLM_VERSION
from sluice.artifacts import TOKENIZER_FILES
from sluice.engine_client.base import GenerateRequest, Sampling
from sluice.engine_client.trtllm_dialect import NUM_RETURN_SEQUENCES_CARRIED, TRTLLM_OUTPUTS, trtllm_tensors
from sluice.engine_client.trtllm_dialect import TOP_K_MAX as DIALECT_TOP_K_MAX
from sluice.wire import EngineError, EngineErrorKind, Guide, GuideKind

MIS = "triton_backend/inflight_batcher_llm/src/model_instance_state.cc"
MS = "triton_backend/inflight_batcher_llm/src/model_state.cc"
UTILS = "triton_backend/inflight_batcher_llm/src/utils.cc"
UTILS_H = "triton_backend/inflight_batcher_llm/src/utils.h"
CONFIG = "triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt"
LLMAPI = "triton_backend/all_models/llmapi/tensorrt_llm"

# Parameters the instance constructor reads with GetParameter outside any try: a missing key throws
# "Cannot find parameter with name: ..." (model_state.cc, GetParameter<std::string>) and the model never
# loads. Value: what a rendered value must match.
REQUIRED_PARAMETERS = {
    "gpt_model_type": (
        r"V1|v1|inflight_batching|inflight_fused_batching",
        f"{MIS} getBatchingTypeFromParams",
    ),
    # Empty (or the unfilled ${...}) means guided decoding off; on, "xgrammar" is the only backend the C++
    # path takes (any other throws) and the info path must exist (TLLM_CHECK). tokenizer_dir: unused there.
    "tokenizer_dir": (r"", f"{MIS} getGuidedDecodingConfigFromParams"),
    "xgrammar_tokenizer_info_path": (r"|/.+\.json", f"{MIS} getGuidedDecodingConfigFromParams"),
    "guided_decoding_backend": (r"|xgrammar", f"{MIS} getGuidedDecodingConfigFromParams"),
    # Read in a try, but TLLM_CHECK "Both encoder and decoder model paths are empty" follows: required.
    "gpt_model_path": (r"/.+", f"{MIS} ModelInstanceState::ModelInstanceState"),
}
# Read in a try whose catch silently takes the default: a value the parser refuses would be ignored, so
# each must parse (GetParameter<bool> takes exactly these spellings: model_state.cc).
BOOL = r"True|true|TRUE|1|False|false|FALSE|0"
PARSED_PARAMETERS = {
    "max_beam_width": (r"[1-9][0-9]*", f"{MIS} getExecutorConfigFromParams"),
    "batch_scheduler_policy": (r"max_utilization|guaranteed_no_evict", f"{MIS} getSchedulerConfigFromParams"),
    "kv_cache_free_gpu_mem_fraction": (r"0?\.[0-9]+|1(\.0*)?", f"{MIS} getKvCacheConfigFromParams"),
    "enable_kv_cache_reuse": (BOOL, f"{MIS} getKvCacheConfigFromParams"),
    "enable_chunked_context": (BOOL, f"{MIS} getExecutorConfigFromParams"),
    "exclude_input_in_output": (BOOL, f"{MIS} ModelInstanceState::ModelInstanceState"),
    "cancellation_check_period_ms": (r"[0-9]+", f"{MIS} ModelInstanceState::ModelInstanceState"),
    "stats_check_period_ms": (r"[0-9]+", f"{MIS} ModelInstanceState::ModelInstanceState"),
    # Orchestrator mode (TRTLLM_ORCHESTRATOR=1) spawns this binary per rank.
    "executor_worker_path": (r"/.+/trtllmExecutorWorker", f"{MS} ModelState::GetExecutorWorkerPath"),
    # Default true: log-probabilities renormalised over the top-k/top-p set a token was drawn from (a greedy
    # token always reads 0). Sluice reports them over the whole vocabulary: rendered false.
    "normalize_log_probs": (r"false", f"{MIS} getExecutorConfigFromParams"),
}
# Present means the model refuses to load ("worker_path parameter is specified, but this is no longer
# supported"): model_state.cc, GetExecutorWorkerPath.
FORBIDDEN_PARAMETERS = {"worker_path"}

# Input tensors (utils.h InputFieldsNames; utils.cc createRequestsFromInputTensors and
# getSamplingConfigFromTensors read them with extractSingleton<T>/extractVector<T>, a reinterpretation of
# the raw bytes: the dtype must be exactly this). dims: config.pbtxt dims after the batch dimension.
INPUTS = {
    # name: (dtype, dims, required, source)
    "input_ids": (
        "TYPE_INT32",
        [-1],
        False,
        f"{UTILS} createRequestsFromInputTensors (extractVector<int32_t>)",
    ),
    "input_lengths": ("TYPE_INT32", [1], True, f"{UTILS} splitBatchInputsTensors"),
    "request_output_len": (
        "TYPE_INT32",
        [1],
        True,
        f"{UTILS} createRequestsFromInputTensors: throws without it",
    ),
    "streaming": ("TYPE_BOOL", [1], False, f"{MIS} createExecutorRequests (getRequestBooleanInputTensor)"),
    "stop": ("TYPE_BOOL", [1], False, f"{MIS} handleStopRequest"),
    "end_id": ("TYPE_INT32", [1], False, f"{UTILS} createRequestsFromInputTensors"),
    "pad_id": ("TYPE_INT32", [1], False, f"{UTILS} createRequestsFromInputTensors"),
    "stop_words_list": (
        "TYPE_INT32",
        [2, -1],
        False,
        f"{UTILS} createRequestsFromInputTensors, convertWordList",
    ),
    "temperature": ("TYPE_FP32", [1], False, f"{UTILS} getSamplingConfigFromTensors"),
    "runtime_top_k": ("TYPE_INT32", [1], False, f"{UTILS} getSamplingConfigFromTensors"),
    "runtime_top_p": ("TYPE_FP32", [1], False, f"{UTILS} getSamplingConfigFromTensors"),
    "seed": ("TYPE_UINT64", [1], False, f"{UTILS} getSamplingConfigFromTensors"),
    "exclude_input_in_output": ("TYPE_BOOL", [1], False, f"{UTILS} createRequestsFromInputTensors"),
    # Issue 25's controls; dtypes and dims as the shipped config declares them (CONFIG).
    "repetition_penalty": ("TYPE_FP32", [1], False, f"{UTILS} getSamplingConfigFromTensors; {CONFIG}"),
    # Squeezed to 1-D (squeezeTensor(..., 1)); an empty one is no bias.
    "embedding_bias": ("TYPE_FP32", [-1], False, f"{UTILS} createRequestsFromInputTensors; {CONFIG}"),
    "return_log_probs": ("TYPE_BOOL", [1], False, f"{UTILS} getOutputConfigFromTensors; {CONFIG}"),
    # One string each: the first 4 bytes (Triton's length prefix) are erased before mapping.
    "guided_decoding_guide_type": ("TYPE_STRING", [1], False, f"{UTILS} getGuidedDecodingParamsFromTensors"),
    "guided_decoding_guide": ("TYPE_STRING", [1], False, f"{UTILS} getGuidedDecodingParamsFromTensors"),
    "num_return_sequences": ("TYPE_INT32", [1], False, f"{UTILS} getSamplingConfigFromTensors; {CONFIG}"),
}
# Inputs the 1.2.0 backend reads into SamplingConfig positions from lengthPenalty on, each bound one slot late
# (NVIDIA/TensorRT-LLM#13633: num_return_sequences becomes noRepeatNgramSize): the gateway sends none.
SHIFTED_INPUTS = {
    name: f"{UTILS} getSamplingConfigFromTensors (17 arguments to a 20-parameter constructor)"
    for name in ("len_penalty", "early_stopping", "no_repeat_ngram_size", "num_return_sequences")
}
# Controls the backend has no input for (utils.h InputFieldsNames has none of these names): refused.
NOT_READ = {
    "min_p": f"{UTILS_H} InputFieldsNames",
    "prompt_ignore_length": f"{UTILS_H} InputFieldsNames (presence/frequency cannot skip the prompt)",
}
# guided_decoding_guide_type strings the backend maps; any other is silently no guide.
GUIDE_TYPES = (
    {"json", "json_schema", "regex", "ebnf_grammar"},
    f"{UTILS} getGuidedDecodingParamsFromTensors",
)
# The tokenizer info file's keys, read with .get<> (a missing one throws at load).
XGRAMMAR_INFO = (
    ("encoded_vocab", "tokenizer_str", "stop_token_ids"),
    f"{MIS} getGuidedDecodingConfigFromParams",
)
# The sampler's largest top-k; a larger one is clamped to it (a narrower cut than asked).
TOP_K_MAX = (1024, "cpp/tensorrt_llm/kernels/samplingTopKKernels.h TOP_K_MAX")
# Output tensors fillTritonResponse writes (model_instance_state.cc): output_ids [1, beams, len] and
# sequence_length [1, beams] must be among the request's outputs ("... must be present in list of
# output tensors"); the logits' dtype must equal the one ModelState::LoadParameters read from the config.
OUTPUTS = {
    "output_ids": ("TYPE_INT32", [-1, -1], f"{MIS} fillTritonResponse"),
    "sequence_length": ("TYPE_INT32", [-1], f"{MIS} fillTritonResponse"),
    "cum_log_probs": ("TYPE_FP32", [-1], f"{MIS} fillTritonResponse"),
    "output_log_probs": ("TYPE_FP32", [-1, -1], f"{MIS} fillTritonResponse"),
    "context_logits": ("TYPE_FP32", [-1, -1], f"{MS} LoadParameters; {MIS} fillTritonResponse"),
    "generation_logits": ("TYPE_FP32", [-1, -1, -1], f"{MS} LoadParameters; {MIS} fillTritonResponse"),
    "batch_index": ("TYPE_INT32", [1], f"{MIS} fillTritonResponse"),
    "sequence_index": ("TYPE_INT32", [1], f"{MIS} fillTritonResponse"),
}
# The gateway streams: createRequestsFromInputTensors throws "Streaming is only supported if model is
# deployed using decoupled mode." (utils.cc); ModelState::LoadParameters reads the policy (model_state.cc).
DECOUPLED = (True, f"{UTILS} createRequestsFromInputTensors; {MS} LoadParameters")

# The llmapi model. model.py: auto_complete_config and initialize read triton_config["decoupled"] and
# triton_config["max_batch_size"] without a fallback; every other model.yaml key goes to LLM().
LLMAPI_TRITON_CONFIG_KEYS = {"decoupled", "max_batch_size"}  # f"{LLMAPI}/1/model.py auto_complete_config"
# LLM() arguments Sluice renders, each a field of tensorrt_llm/llmapi/llm_args.py (BaseLlmArgs / TorchLlmArgs)
# or of the shipped model.yaml sample (model, backend, tensor_parallel_size, pipeline_parallel_size).
LLM_ARGUMENTS = {
    "model", "backend", "dtype", "tensor_parallel_size", "pipeline_parallel_size", "max_batch_size",
    "max_num_tokens", "max_seq_len", "max_input_len", "enable_chunked_prefill", "kv_cache_config",
}  # fmt: skip
LLMAPI_INPUTS = {  # f"{LLMAPI}/config.pbtxt"; read by model.py _convert_request and helpers.py
    "text_input": ("TYPE_STRING", [-1], True),
    "streaming": ("TYPE_BOOL", [1], False),
    "sampling_param_temperature": ("TYPE_FP32", [1], False),
    "sampling_param_top_k": ("TYPE_INT32", [1], False),
    "sampling_param_top_p": ("TYPE_FP32", [1], False),
    "sampling_param_max_tokens": ("TYPE_INT32", [1], False),
    "sampling_param_stop": ("TYPE_STRING", [-1], False),
    "sampling_param_seed": ("TYPE_UINT64", [1], False),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", [1], False),
    "return_finish_reason": ("TYPE_BOOL", [1], False),
    "stop": ("TYPE_BOOL", [1], False),
}
# model.py: get_output_config_by_name(self.model_config, "text_output") at initialize; finish_reason
# when return_finish_reason is sent (_create_response).
LLMAPI_OUTPUTS = {"text_output": ("TYPE_STRING", [-1]), "finish_reason": ("TYPE_STRING", [-1])}
LLMAPI_FILES = ("model.py", "helpers.py")  # model.py: "from helpers import ..."

TYPE_NAMES = {v: k for k, v in model_config_pb2.DataType.items()}
INFO = CheckpointInfo("llama", 2, 64, 256, 20, "bfloat16")


def _parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _fake_trtllm_artifact(root: Path, world_size: int, tokenizer_from: Path | None = None) -> Path:
    """An artifact's layout (engine/ with trtllm-build's config.json; the tokenizer at the top level when
    ``tokenizer_from`` is given) with fake engine bytes."""
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "rank0.engine").write_bytes(b"x")
    mapping = {"world_size": world_size, "tp_size": world_size, "pp_size": 1}
    (root / "engine" / "config.json").write_text(
        json.dumps({"pretrained_config": {"mapping": mapping}, "build_config": {}})
    )
    for name in TOKENIZER_FILES if tokenizer_from is not None else ():
        if (tokenizer_from / name).is_file():
            shutil.copyfile(tokenizer_from / name, root / name)
    return root


def _rendered_trtllm_configs(
    tmp_path: Path, tokenizer_from: Path
) -> list[tuple[str, model_config_pb2.ModelConfig]]:
    """Every tensorrt_llm config.pbtxt the CLI's options produce, from the build plan and a replica."""
    configs = []
    for fp8, (tp, pp), reuse in itertools.product(
        (False, True), ((1, 1), (2, 1), (2, 2), (4, 1)), (False, True)
    ):
        spec = BuildSpec(
            source_uri="s3://weights/checkpoints/m", model="m", version="3", target="trtllm", tp_size=tp,
            pp_size=pp, quantization="fp8" if fp8 else None, calib_dataset="/calib" if fp8 else None,
        )  # fmt: skip
        plan = plan_build(
            spec, source_dir=tmp_path, info=INFO, work_dir=tmp_path / "w", source_weights_digest="sha256:x",
            versions={}, trtllm_examples=tmp_path, calib_dir="/calib" if fp8 else None,
        )  # fmt: skip
        configs.append((f"plan fp8={fp8} tp={tp} pp={pp}", _parse(plan.rendered["m/config.pbtxt"])))
        serving = TrtllmServing(enable_kv_cache_reuse=reuse)
        text = render_trtllm(
            model_name="m", triton_version=3, engine_dir="/e", weights_digest_value="d", max_batch_size=8,
            serving=serving,
        )["m/config.pbtxt"]  # fmt: skip
        configs.append((f"render kv_reuse={reuse}", _parse(text)))
    build_config = {"target": "trtllm", "max_batch_size": 8, "tp_size": 2, "pp_size": 1}
    for tokenizer in (None, tokenizer_from):
        artifact = _fake_trtllm_artifact(tmp_path / f"artifact-{tokenizer is None}", 2, tokenizer)
        model_dir = render_for_replica(
            artifact, tmp_path / f"repo-{tokenizer is None}", "m", "3", build_config
        )
        label = f"replica tp=2 {'with' if tokenizer else 'without'} a tokenizer"
        configs.append((label, _parse((model_dir / "config.pbtxt").read_text())))
    return configs


def test_every_rendered_tensorrt_llm_repository_meets_the_backends_contract(
    tmp_path: Path, dev_checkpoint: Path
) -> None:
    for label, config in _rendered_trtllm_configs(tmp_path, dev_checkpoint):
        params = {k: v.string_value for k, v in config.parameters.items()}
        for name, (pattern, source) in {**REQUIRED_PARAMETERS, **PARSED_PARAMETERS}.items():
            assert name in params, f"{label}: parameter {name} missing ({source})"
            assert re.fullmatch(pattern, params[name]), f"{label}: {name}={params[name]!r} ({source})"
        # Guided decoding: both or neither (either one empty is off: getGuidedDecodingConfigFromParams).
        guided = (params["guided_decoding_backend"], params["xgrammar_tokenizer_info_path"])
        assert all(guided) or not any(guided), f"{label}: {guided}"
        assert not FORBIDDEN_PARAMETERS & set(params), label
        assert config.backend == "tensorrtllm" and config.max_batch_size >= 1, label
        assert config.model_transaction_policy.decoupled is DECOUPLED[0], f"{label} ({DECOUPLED[1]})"
        inputs = {i.name: i for i in config.input}
        for name, (dtype, dims, required, source) in INPUTS.items():
            assert name in inputs, f"{label}: input {name} missing ({source})"
            got = inputs[name]
            assert (TYPE_NAMES[got.data_type], list(got.dims)) == (dtype, dims), f"{label}: {name} ({source})"
            assert got.optional is not required, f"{label}: {name} optional={got.optional} ({source})"
        assert set(inputs) <= set(INPUTS), f"{label}: inputs not in the table: {set(inputs) - set(INPUTS)}"
        outputs = {o.name: o for o in config.output}
        for name, (dtype, dims, source) in OUTPUTS.items():
            got = outputs[name]
            assert (TYPE_NAMES[got.data_type], list(got.dims)) == (dtype, dims), f"{label}: {name} ({source})"


VOCAB = 32
GATEWAY_REQUESTS = [
    GenerateRequest("r1", [1, 2, 3], Sampling(8, temperature=0.0), eos_token_ids=(2,), cache_scope="t"),
    GenerateRequest(
        "r2",
        [5],
        Sampling(4, temperature=0.7, top_p=0.9, seed=7),
        stop_token_ids=(9,),
        eos_token_ids=(2, 3),
        cache_scope="t",
    ),
    GenerateRequest(
        "r3",
        [5, 6],
        Sampling(
            4,
            temperature=0.7,
            top_k=40,
            repetition_penalty=1.1,
            logit_bias=((4, -1.0), (31, 2.0)),
            guide=Guide(GuideKind.JSON_SCHEMA, '{"type": "object"}'),
            logprobs=0,
        ),
        eos_token_ids=(2,),
        cache_scope="t",
        vocab_size=VOCAB,
    ),
    GenerateRequest(
        "r4", [5], Sampling(4, guide=Guide(GuideKind.JSON), logprobs=0), eos_token_ids=(2,), cache_scope="t"
    ),
    GenerateRequest(
        "r5", [5], Sampling(4, guide=Guide(GuideKind.REGEX, "[0-9]+")), eos_token_ids=(2,), cache_scope="t"
    ),
]
DTYPES = {
    "TYPE_INT32": np.int32,
    "TYPE_FP32": np.float32,
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT64": np.uint64,
    "TYPE_STRING": np.object_,
}


def test_the_gateways_tensorrt_llm_requests_send_only_table_tensors_with_the_tables_dtypes() -> None:
    for request in GATEWAY_REQUESTS:
        tensors = trtllm_tensors(request)
        assert {"input_ids", "request_output_len"} <= set(tensors)
        assert not set(tensors) & set(SHIFTED_INPUTS), SHIFTED_INPUTS
        for name, array in tensors.items():
            dtype, dims, _, source = INPUTS[name]
            assert array.dtype == DTYPES[dtype], f"{name} ({source})"
            assert array.ndim == 1 + len(dims), f"{name}: batch dimension + {dims} ({source})"
            for sent, declared in zip(array.shape[1:], dims, strict=True):
                assert declared == -1 or sent == declared, f"{name}: {array.shape} ({source})"
    # output_ids and sequence_length are required by fillTritonResponse; output_log_probs [1, beams, T] and
    # sequence_index [1, 1] (only when num_return_sequences > 1) are what the decoder reads besides.
    assert set(TRTLLM_OUTPUTS) == {"output_ids", "sequence_length", "output_log_probs", "sequence_index"}
    assert set(TRTLLM_OUTPUTS) <= set(OUTPUTS)


def test_logit_bias_is_a_dense_bias_as_long_as_the_models_vocabulary() -> None:
    """createNewDecoderRequests.cpp: "Expected last dimension to be same as vocab size" (the model's, from
    its config); FP32 is taken for FP32 logits and copied to half for FP16 ones (getEmbeddingBias)."""
    bias = trtllm_tensors(GATEWAY_REQUESTS[2])["embedding_bias"]
    assert bias.shape == (1, VOCAB) and bias.dtype == np.float32
    assert (bias[0, 4], bias[0, 31], float(np.abs(bias).sum())) == (-1.0, 2.0, 3.0)


def test_the_guide_types_sluice_sends_are_the_ones_the_backend_maps() -> None:
    types, source = GUIDE_TYPES
    assert {kind.value for kind in GuideKind} <= types, source  # GuideKind's values are the backend's own
    for request in GATEWAY_REQUESTS:
        tensors = trtllm_tensors(request)
        if "guided_decoding_guide_type" in tensors:
            assert tensors["guided_decoding_guide_type"].reshape(-1)[0].decode() in types, source
            assert "guided_decoding_guide" in tensors  # json_schema and regex need their text


def test_what_the_backend_cannot_carry_is_neither_declared_nor_sent_but_refused(tmp_path: Path) -> None:
    text = render_trtllm(
        model_name="m", triton_version=1, engine_dir="/e", weights_digest_value="d", max_batch_size=8
    )["m/config.pbtxt"]
    declared = {i.name for i in _parse(text).input}
    assert not declared & set(NOT_READ), NOT_READ
    refused = [
        Sampling(4, temperature=0.7, min_p=0.05),  # NOT_READ: min_p
        Sampling(4, presence_penalty=0.5),  # NOT_READ: prompt_ignore_length (penaltyKernels.cu counts it)
        Sampling(4, frequency_penalty=0.5),
        Sampling(4, temperature=0.7, n=2),  # SHIFTED_INPUTS: num_return_sequences on 1.2.0
        Sampling(4, logprobs=2),  # fillTritonResponse writes no alternatives
        Sampling(4, temperature=0.7, top_k=TOP_K_MAX[0] + 1),  # TOP_K_MAX
    ]
    for sampling in refused:
        request = GenerateRequest("r", [1], sampling, eos_token_ids=(2,), cache_scope="t", vocab_size=50_000)
        with pytest.raises(EngineError, match="not supported by this model's engine") as err:
            trtllm_tensors(request)
        assert err.value.kind is EngineErrorKind.INVALID_REQUEST


def test_the_pinned_release_never_sends_num_return_sequences() -> None:
    """NVIDIA/TensorRT-LLM#13633: the release's backend binds it to noRepeatNgramSize."""
    assert TRTLLM_VERSION == "1.2.0" and NUM_RETURN_SEQUENCES_CARRIED is False, SHIFTED_INPUTS
    assert TOP_K_MAX[0] == DIALECT_TOP_K_MAX


def test_a_replica_renders_structured_output_from_its_artifacts_tokenizer(
    tmp_path: Path, dev_checkpoint: Path
) -> None:
    """The tokenizer info file is what TensorRT-LLM's own examples/generate_xgrammar_tokenizer_info.py
    writes (tensorrt_llm/llmapi/tokenizer.py _xgrammar_tokenizer_info, here rerun with transformers), under
    the keys getGuidedDecodingConfigFromParams reads."""
    artifact = _fake_trtllm_artifact(tmp_path / "artifact", 1, dev_checkpoint)
    build_config = {"target": "trtllm", "max_batch_size": 8, "tp_size": 1, "pp_size": 1}
    model_dir = render_for_replica(artifact, tmp_path / "repo", "m", "2", build_config)
    params = {
        k: v.string_value for k, v in _parse((model_dir / "config.pbtxt").read_text()).parameters.items()
    }
    info_path = Path(params["xgrammar_tokenizer_info_path"])
    assert params["guided_decoding_backend"] == "xgrammar" and params["tokenizer_dir"] == ""
    assert info_path.is_absolute() and info_path == (model_dir / XGRAMMAR_TOKENIZER_INFO).resolve()
    info = json.loads(info_path.read_text())
    keys, source = XGRAMMAR_INFO
    assert tuple(info) == keys, source
    assert all(isinstance(t, str) for t in info["encoded_vocab"])
    assert all(isinstance(i, int) for i in info["stop_token_ids"]) and info["stop_token_ids"]
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(dev_checkpoint))
    assert info["encoded_vocab"] == [t for t, _ in sorted(hf.get_vocab().items(), key=lambda x: x[1])]
    ours, theirs = json.loads(info["tokenizer_str"]), json.loads(hf.backend_tokenizer.to_str())
    for part in (
        "model",
        "decoder",
        "normalizer",
        "pre_tokenizer",
    ):  # what xgrammar detects the encoding from
        assert ours[part] == theirs[part], part
    assert hf.eos_token_id in info["stop_token_ids"]  # TensorRT-LLM's [eos_token_id], and the model's others
    # Triton loads a model folder holding the file beside config.pbtxt and its version folder.
    assert sorted(p.name for p in model_dir.iterdir()) == ["2", "config.pbtxt", XGRAMMAR_TOKENIZER_INFO]


def test_every_rendered_llmapi_repository_meets_the_llmapi_models_contract(
    tmp_path: Path, dev_checkpoint: Path
) -> None:
    shipped = tmp_path / "llmapi"  # stands in for the release's llmapi/tensorrt_llm/1
    shipped.mkdir()
    for name in LLMAPI_FILES:
        (shipped / name).write_text(f"# {name}\n")
    for tp, pp in ((1, 1), (2, 1), (2, 2)):
        build_config = {
            "target": "trtllm-llmapi", "dtype": "bfloat16", "tp_size": tp, "pp_size": pp, "max_batch_size": 8,
            "max_num_tokens": 512, "max_input_len": 256, "max_seq_len": 512,
        }  # fmt: skip
        model_dir = render_for_replica(
            dev_checkpoint, tmp_path / f"repo{tp}{pp}", "m", "2", build_config, llmapi_model_dir=shipped
        )
        assert sorted(p.name for p in (model_dir / "2").iterdir()) == sorted([*LLMAPI_FILES, "model.yaml"])
        model_yaml = yaml.safe_load((model_dir / "2" / "model.yaml").read_text())
        assert set(model_yaml["triton_config"]) >= LLMAPI_TRITON_CONFIG_KEYS
        assert set(model_yaml) - {"triton_config"} <= LLM_ARGUMENTS
        assert (model_yaml["tensor_parallel_size"], model_yaml["pipeline_parallel_size"]) == (tp, pp)
        config = _parse((model_dir / "config.pbtxt").read_text())
        # The shipped config.pbtxt: "The below config arguments are specific in model.yaml. Please
        # don't add it in config.pbtxt" (max_batch_size, model_transaction_policy).
        assert config.max_batch_size == 0 and not config.HasField("model_transaction_policy")
        assert config.backend == "python"
        inputs = {i.name: i for i in config.input}
        for name, (dtype, dims, required) in LLMAPI_INPUTS.items():
            got = inputs[name]
            assert (TYPE_NAMES[got.data_type], list(got.dims), got.optional) == (dtype, dims, not required), (
                name
            )
        assert set(inputs) <= set(LLMAPI_INPUTS)
        outputs = {o.name: o for o in config.output}
        for name, (dtype, dims) in LLMAPI_OUTPUTS.items():
            assert (TYPE_NAMES[outputs[name].data_type], list(outputs[name].dims)) == (dtype, dims), name


def test_the_fake_backend_reads_and_writes_only_what_the_backend_declares() -> None:
    """tests/engine_client/fake_trtllm_model.py stands in for the backend in a real tritonserver: every
    input it reads is one of the table's, every output it writes one of fillTritonResponse's."""
    source = (Path(__file__).parents[1] / "engine_client" / "fake_trtllm_model.py").read_text()
    read = set(re.findall(r'_(?:input|scalar)\(request, "(\w+)"', source))
    written = set(re.findall(r'pb_utils\.Tensor\("(\w+)"', source))
    assert read and read <= set(INPUTS), read - set(INPUTS)
    assert written == set(TRTLLM_OUTPUTS) and written <= set(OUTPUTS), written


SINGLE_FACTS = {"GUIDE_TYPES": GUIDE_TYPES, "XGRAMMAR_INFO": XGRAMMAR_INFO, "TOP_K_MAX": TOP_K_MAX}


@pytest.mark.parametrize(
    "table",
    [REQUIRED_PARAMETERS, PARSED_PARAMETERS, INPUTS, OUTPUTS, SHIFTED_INPUTS, NOT_READ, SINGLE_FACTS],
)
def test_every_fact_names_where_in_the_backends_source_it_came_from(table: dict[str, Any]) -> None:
    for name, fact in table.items():
        source = fact if isinstance(fact, str) else fact[-1]
        assert re.match(r"(triton_backend|tensorrt_llm|cpp)/\S+\.(cc|h|py|pbtxt) \S", source), (name, source)
    assert sys.modules[__name__].__doc__ and "@ 0c8de69a1ca6" in sys.modules[__name__].__doc__
