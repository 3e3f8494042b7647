"""The Triton model repositories of the three targets, rendered from ``model_repository/`` templates.

- ``cpu``: the CPU engine's model (``replicas.render``, unchanged);
- ``trtllm``: the tensorrtllm_backend ``inflight_batcher_llm`` repository's ``tensorrt_llm`` model alone
  (``model_repository/trtllm/tensorrt_llm/``): the gateway tokenizes and detokenizes, so the replica
  takes token ids and streams token ids back, and the ensemble with its ``preprocessing`` /
  ``postprocessing`` Python models (tokenizer on the replica) would only add a hop;
- ``trtllm-llmapi``: TensorRT-LLM's PyTorch-backend ``llmapi`` model (``model_repository/trtllm/llmapi/``):
  ``config.pbtxt`` and ``model.yaml`` (arguments of ``tensorrt_llm.LLM()``), no engine; the release's
  ``model.py`` and the ``helpers.py`` it imports are copied in beside ``model.yaml``.

Every render goes through ``replicas.render.fill_template``: a placeholder left unfilled or a value
for a placeholder the template lacks is a ValueError. ``render_for_replica`` is what a replica calls at
start on its cached artifact, with the registry version's build config.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from build_engines.guided_decoding import (
    GUIDED_DECODING_BACKEND,
    XGRAMMAR_TOKENIZER_INFO,
    xgrammar_tokenizer_info_text,
)
from build_engines.replica_launch import world_size
from build_engines.trtllm_release import LLMAPI_MODEL_FILES
from replicas.render import (
    SOURCE_DIR as CPU_SOURCE_DIR,
)
from replicas.render import (
    TEMPLATE_NAME,
    CpuEngineModelSettings,
    fill_template,
    render_model_repository,
)
from sluice.engine_limits import read_engine_config
from sluice.weights_digest import weights_digest

TRTLLM_DIR = CPU_SOURCE_DIR.parent / "trtllm"
# A trtllm artifact: the engine under engine/; the tokenizer and the model's config.json at the top level,
# where every target's artifact has them (a gateway fetches only those: ``sluice.artifacts``).
ENGINE_SUBDIR = "engine"
MODEL_YAML = "model.yaml"


@dataclass(frozen=True)
class TrtllmServing:
    """The runtime knobs both TensorRT-LLM targets render (the backend's parameter names)."""

    decoupled_mode: bool = True  # streaming needs it
    batching_strategy: str = "inflight_fused_batching"
    # Of the GPU memory left once the engine is loaded, what the paged KV cache takes (backend default).
    kv_cache_free_gpu_mem_fraction: float = 0.9
    # Prefix reuse of KV blocks across requests. Off unless explicitly allowed: TensorRT-LLM's Triton model
    # takes no per-request cache salt, so it cannot scope reuse to one tenant as the CPU engine does, and
    # a shared prefix cache lets one tenant time another's prompts (sluice.engine_client.dialects).
    enable_kv_cache_reuse: bool = False
    enable_chunked_context: bool = True  # long prompts prefilled in chunks between decode steps
    # Never pause a started request (max_utilization packs more but may pause some).
    batch_scheduler_policy: str = "guaranteed_no_evict"
    # Triton's own queue in front of the model; 0: unbounded. The gateway holds the real queue and
    # dispatches only what a replica has room for.
    max_queue_size: int = 0
    max_queue_delay_microseconds: int = 0
    cancellation_check_period_ms: int = 100  # the backend's default
    stats_check_period_ms: int = 100
    exclude_input_in_output: bool = True  # the gateway streams new tokens only
    max_beam_width: int = 1
    logits_datatype: str = "TYPE_FP32"
    # output_log_probs over the whole vocabulary, not renormalised over the top-k/top-p set (the backend's
    # default, under which a greedy token's log-probability is always 0).
    normalize_log_probs: bool = False
    # Structured output: the backend reads these three without a fallback; "" means unset (off). On:
    # guided_decoding_backend "xgrammar" with the tokenizer info file (``trtllm_guided_decoding``).
    tokenizer_dir: str = ""
    guided_decoding_backend: str = ""
    xgrammar_tokenizer_info_path: str = ""

    def __post_init__(self) -> None:
        if self.batching_strategy not in ("inflight_fused_batching", "V1"):
            raise ValueError(
                f"batching_strategy must be inflight_fused_batching or V1, got {self.batching_strategy!r}"
            )
        if self.batch_scheduler_policy not in ("guaranteed_no_evict", "max_utilization"):
            raise ValueError(f"unknown batch_scheduler_policy {self.batch_scheduler_policy!r}")
        if not 0 < self.kv_cache_free_gpu_mem_fraction <= 1:
            raise ValueError("kv_cache_free_gpu_mem_fraction must be in (0, 1]")
        if min(self.max_queue_size, self.max_queue_delay_microseconds, self.cancellation_check_period_ms) < 0:
            raise ValueError("queue size, queue delay and cancellation period must be >= 0")
        if self.guided_decoding_backend not in ("", GUIDED_DECODING_BACKEND):
            raise ValueError(f"the tensorrt_llm backend's guided decoding is {GUIDED_DECODING_BACKEND} only")
        if bool(self.guided_decoding_backend) != bool(self.xgrammar_tokenizer_info_path):
            raise ValueError("guided decoding needs both its backend and its tokenizer info path, or neither")

    def values(self) -> dict[str, str]:
        """Template values: booleans as the backend and YAML read them (true/false)."""
        return {k: _text(v) for k, v in asdict(self).items()}


def guided_serving(info_path: Path, serving: TrtllmServing | None = None) -> TrtllmServing:
    """``serving`` with structured output on, its tokenizer info at ``info_path`` (absolute)."""
    return replace(
        serving or TrtllmServing(),
        guided_decoding_backend=GUIDED_DECODING_BACKEND,
        xgrammar_tokenizer_info_path=str(info_path),
    )


def trtllm_guided_decoding(
    tokenizer_dir: Path, repository_dir: Path, model_name: str, serving: TrtllmServing | None = None
) -> tuple[TrtllmServing, dict[str, str]]:
    """The serving knobs and the extra file of a ``tensorrt_llm`` model with structured output on: the
    tokenizer info (``build_engines.guided_decoding``) of ``tokenizer_dir``'s tokenizer, written beside
    the model's config.pbtxt in ``repository_dir``. Without a tokenizer.json there: off, no file."""
    text = xgrammar_tokenizer_info_text(tokenizer_dir)
    if text is None:
        return serving or TrtllmServing(), {}
    info_path = (repository_dir / model_name / XGRAMMAR_TOKENIZER_INFO).resolve()
    return guided_serving(info_path, serving), {f"{model_name}/{XGRAMMAR_TOKENIZER_INFO}": text}


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def render_trtllm(
    *,
    model_name: str,
    triton_version: int,
    engine_dir: str,
    weights_digest_value: str,
    max_batch_size: int,
    serving: TrtllmServing | None = None,
) -> dict[str, str]:
    """``{repository-relative path: text}`` of the ``tensorrt_llm`` model serving ``engine_dir``."""
    values = (serving or TrtllmServing()).values()
    values.update(
        model_name=model_name,
        model_version=str(triton_version),
        engine_dir=engine_dir,
        weights_digest=weights_digest_value,
        triton_max_batch_size=str(max_batch_size),
    )
    template = (TRTLLM_DIR / "tensorrt_llm" / TEMPLATE_NAME).read_text()
    return {f"{model_name}/config.pbtxt": fill_template(template, values)}


def render_llmapi(
    *,
    model_name: str,
    triton_version: int,
    checkpoint_dir: str,
    weights_digest_value: str,
    build_config: Mapping[str, Any],
    serving: TrtllmServing | None = None,
) -> dict[str, str]:
    """``{repository-relative path: text}`` of the ``llmapi`` model: ``config.pbtxt`` and the version
    folder's ``model.yaml`` (the llmapi ``model.py`` goes beside it: ``write_repository``)."""
    knobs = (serving or TrtllmServing()).values()
    config_values = {
        "model_name": model_name,
        "model_version": str(triton_version),
        "weights_digest": weights_digest_value,
    }
    yaml_values = {
        "checkpoint_dir": checkpoint_dir,
        "dtype": str(build_config["dtype"]),
        "tp_size": str(build_config["tp_size"]),
        "pp_size": str(build_config.get("pp_size", 1)),
        "max_batch_size": str(build_config["max_batch_size"]),
        "max_num_tokens": str(build_config["max_num_tokens"]),
        "max_seq_len": str(build_config["max_seq_len"]),
        "max_input_len": str(build_config["max_input_len"]),
        "enable_chunked_prefill": knobs["enable_chunked_context"],
        "kv_cache_free_gpu_mem_fraction": knobs["kv_cache_free_gpu_mem_fraction"],
        "enable_kv_cache_reuse": knobs["enable_kv_cache_reuse"],
        "decoupled_mode": knobs["decoupled_mode"].capitalize(),  # YAML reads True/False alike
    }
    source = TRTLLM_DIR / "llmapi"
    return {
        f"{model_name}/config.pbtxt": fill_template((source / TEMPLATE_NAME).read_text(), config_values),
        f"{model_name}/{triton_version}/{MODEL_YAML}": fill_template(
            (source / f"{MODEL_YAML}.template").read_text(), yaml_values
        ),
    }


def render_cpu(settings: CpuEngineModelSettings) -> dict[str, str]:
    """The CPU engine's ``config.pbtxt`` as text (the files of its version folder are copied, not
    rendered: ``render_model_repository`` writes both)."""
    template = (CPU_SOURCE_DIR / TEMPLATE_NAME).read_text()
    return {f"{settings.model_name}/config.pbtxt": fill_template(template, settings.template_values())}


def write_repository(out_dir: Path, files: Mapping[str, str], model_name: str, triton_version: int) -> Path:
    """Write rendered ``files`` under ``out_dir`` (replacing the model's folder) with the version folder
    made even when empty (the tensorrtllm backend needs it). Returns the model's folder."""
    model_dir = out_dir / model_name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    (model_dir / str(triton_version)).mkdir(parents=True)
    for relative, text in files.items():
        path = out_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return model_dir


def render_for_replica(
    artifact_dir: Path,
    out_dir: Path,
    model_name: str,
    version: str,
    build_config: Mapping[str, Any] | None = None,
    *,
    expected_digest: str | None = None,
    llmapi_model_dir: Path | None = None,
) -> Path:
    """Render the repository a replica serves from its cached artifact and return the model's folder.

    ``build_config``: the registry version's, whose ``target`` picks the model (None: a cpu artifact,
    dtype "auto"). ``expected_digest``: the registry's weights digest, checked against the artifact's
    before anything is written. ``llmapi_model_dir``: TensorRT-LLM's
    ``triton_backend/all_models/llmapi/tensorrt_llm/1/`` with ``model.py`` and ``helpers.py`` (the
    trtllm-llmapi target needs both; they ship with TensorRT-LLM, not with Sluice). A trtllm engine built
    for another tp x pp than the version records is refused."""
    build_config = build_config or {"target": "cpu"}
    target = build_config.get("target", "cpu")
    triton_version = int(version)
    weights_dir = artifact_dir / ENGINE_SUBDIR if target == "trtllm" else artifact_dir
    digest = weights_digest(weights_dir)
    if expected_digest is not None and digest != expected_digest:
        raise ValueError(
            f"{weights_dir} has weights digest {digest}, the registry's version has {expected_digest}"
        )
    if target == "cpu":
        settings = CpuEngineModelSettings(
            checkpoint_dir=artifact_dir,
            model_name=model_name,
            model_version=triton_version,
            weights_digest=digest,
            dtype=build_config.get("dtype", "auto"),
        )
        return render_model_repository(out_dir, settings)
    if target == "trtllm":
        _check_engine_world_size(weights_dir, build_config)
        # Structured output from the artifact's own tokenizer (at its top level, where the gateway reads it).
        serving, guided_files = trtllm_guided_decoding(artifact_dir, out_dir, model_name)
        files = render_trtllm(
            model_name=model_name,
            triton_version=triton_version,
            engine_dir=str(weights_dir.resolve()),
            weights_digest_value=digest,
            max_batch_size=int(build_config["max_batch_size"]),
            serving=serving,
        )
        return write_repository(out_dir, files | guided_files, model_name, triton_version)
    if target == "trtllm-llmapi":
        missing = [
            name
            for name in LLMAPI_MODEL_FILES
            if llmapi_model_dir is None or not (llmapi_model_dir / name).is_file()
        ]
        if missing:
            raise ValueError(
                f"the llmapi model needs TensorRT-LLM's llmapi {' and '.join(LLMAPI_MODEL_FILES)} "
                f"(model.py imports helpers.py from beside it); {llmapi_model_dir} lacks {', '.join(missing)}"
            )
        assert llmapi_model_dir is not None
        files = render_llmapi(
            model_name=model_name,
            triton_version=triton_version,
            checkpoint_dir=str(artifact_dir.resolve()),
            weights_digest_value=digest,
            build_config=build_config,
        )
        model_dir = write_repository(out_dir, files, model_name, triton_version)
        for name in LLMAPI_MODEL_FILES:
            shutil.copy2(llmapi_model_dir / name, model_dir / str(triton_version) / name)
        return model_dir
    raise ValueError(f"unknown build target {target!r} in the version's build config")


def _check_engine_world_size(engine_dir: Path, build_config: Mapping[str, Any]) -> None:
    """The engine's own mapping (trtllm-build's config.json) must be the tp x pp the version records:
    the replica requests that many GPUs and the backend loads one rank per GPU."""
    mapping = read_engine_config(engine_dir).get("pretrained_config", {}).get("mapping", {})
    engine_world = mapping.get("world_size", mapping.get("tp_size", 1) * mapping.get("pp_size", 1))
    if engine_world != world_size(build_config):
        raise ValueError(
            f"{engine_dir} was built for {engine_world} GPU ranks, the version's build config says "
            f"tp_size x pp_size = {world_size(build_config)}"
        )
