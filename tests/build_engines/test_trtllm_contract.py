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

Checked against every ``tensorrt_llm`` repository the CLI can produce (FP8 or not, tp/pp 1, 2, 4,
KV reuse on and off, the build's render and a replica's) and every llmapi one; and the gateway's
tensorrt_llm dialect against the input table. No GPU ran any of it: docs/operations.md says so.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from build_engines.checkpoint import CheckpointInfo
from build_engines.plan import plan_build
from build_engines.repository import TrtllmServing, render_for_replica, render_trtllm
from build_engines.spec import BuildSpec
from sluice.engine_client.base import GenerateRequest, Sampling
from sluice.engine_client.dialects import TRTLLM_OUTPUTS, trtllm_tensors

MIS = "triton_backend/inflight_batcher_llm/src/model_instance_state.cc"
MS = "triton_backend/inflight_batcher_llm/src/model_state.cc"
UTILS = "triton_backend/inflight_batcher_llm/src/utils.cc"
LLMAPI = "triton_backend/all_models/llmapi/tensorrt_llm"

# Parameters the instance constructor reads with GetParameter outside any try: a missing key throws
# "Cannot find parameter with name: ..." (model_state.cc, GetParameter<std::string>) and the model never
# loads. Value: what a rendered value must match.
REQUIRED_PARAMETERS = {
    "gpt_model_type": (
        r"V1|v1|inflight_batching|inflight_fused_batching",
        f"{MIS} getBatchingTypeFromParams",
    ),
    # Empty (or the unfilled ${...}) means guided decoding off; xgrammar would need the info file.
    "tokenizer_dir": (r"", f"{MIS} getGuidedDecodingConfigFromParams"),
    "xgrammar_tokenizer_info_path": (r"", f"{MIS} getGuidedDecodingConfigFromParams"),
    "guided_decoding_backend": (r"", f"{MIS} getGuidedDecodingConfigFromParams"),
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
}
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


def _rendered_trtllm_configs(tmp_path: Path) -> list[tuple[str, model_config_pb2.ModelConfig]]:
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
    artifact = tmp_path / "artifact"
    (artifact / "engine").mkdir(parents=True)
    (artifact / "engine" / "rank0.engine").write_bytes(b"x")
    mapping = {"world_size": 2, "tp_size": 2, "pp_size": 1}
    (artifact / "engine" / "config.json").write_text(
        json.dumps({"pretrained_config": {"mapping": mapping}, "build_config": {}})
    )
    build_config = {"target": "trtllm", "max_batch_size": 8, "tp_size": 2, "pp_size": 1}
    model_dir = render_for_replica(artifact, tmp_path / "repo", "m", "3", build_config)
    configs.append(("replica tp=2", _parse((model_dir / "config.pbtxt").read_text())))
    return configs


def test_every_rendered_tensorrt_llm_repository_meets_the_backends_contract(tmp_path: Path) -> None:
    for label, config in _rendered_trtllm_configs(tmp_path):
        params = {k: v.string_value for k, v in config.parameters.items()}
        for name, (pattern, source) in {**REQUIRED_PARAMETERS, **PARSED_PARAMETERS}.items():
            assert name in params, f"{label}: parameter {name} missing ({source})"
            assert re.fullmatch(pattern, params[name]), f"{label}: {name}={params[name]!r} ({source})"
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


def test_the_gateways_tensorrt_llm_requests_send_only_table_tensors_with_the_tables_dtypes() -> None:
    dtypes = {
        "TYPE_INT32": np.int32,
        "TYPE_FP32": np.float32,
        "TYPE_BOOL": np.bool_,
        "TYPE_UINT64": np.uint64,
    }
    requests = [
        GenerateRequest("r1", [1, 2, 3], Sampling(8, temperature=0.0), eos_token_ids=(2,), cache_scope="t"),
        GenerateRequest(
            "r2",
            [5],
            Sampling(4, temperature=0.7, top_p=0.9, seed=7),
            stop_token_ids=(9,),
            eos_token_ids=(2, 3),
            cache_scope="t",
        ),
    ]
    for request in requests:
        tensors = trtllm_tensors(request)
        assert {"input_ids", "request_output_len"} <= set(tensors)
        for name, array in tensors.items():
            dtype, dims, _, source = INPUTS[name]
            assert array.dtype == dtypes[dtype], f"{name} ({source})"
            assert array.ndim == 1 + len(dims), f"{name}: batch dimension + {dims} ({source})"
    assert set(TRTLLM_OUTPUTS) == {"output_ids", "sequence_length"}  # both required by fillTritonResponse


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


@pytest.mark.parametrize("table", [REQUIRED_PARAMETERS, PARSED_PARAMETERS, INPUTS, OUTPUTS])
def test_every_fact_names_where_in_the_backends_source_it_came_from(table: dict[str, tuple]) -> None:
    for name, fact in table.items():
        source = fact[-1]
        assert re.match(r"(triton_backend|tensorrt_llm)/\S+\.(cc|py|pbtxt) \S", source), (name, source)
    assert sys.modules[__name__].__doc__ and "@ 0c8de69a1ca6" in sys.modules[__name__].__doc__
