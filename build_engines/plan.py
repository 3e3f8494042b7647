"""The build plan: every step of one build, with the exact external commands and the rendered
configurations, computed from the inputs alone (no I/O but reading the templates). ``--dry-run`` prints
it; ``build_engines.pipeline`` executes it step by step.

Steps by target (each a ``Step``: a name, one readable line, and the command when it is a program run):

- ``cpu``: fetch, check, render, upload, register;
- ``trtllm``: fetch, check, convert (``convert_checkpoint.py`` of the model's family) or quantize
  (ModelOpt ``quantize.py --qformat fp8``), build (``trtllm-build`` with paged KV and paged context
  FMHA), stage (engine + tokenizer into the artifact folder), render, upload, register;
- ``trtllm-llmapi``: fetch, check, render, upload, register (the PyTorch backend loads the checkpoint
  itself: no engine).
"""

from __future__ import annotations

import importlib.metadata
import json
import shlex
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from build_engines.checkpoint import CheckpointInfo
from build_engines.guided_decoding import XGRAMMAR_TOKENIZER_INFO
from build_engines.repository import (
    ENGINE_SUBDIR,
    guided_serving,
    render_cpu,
    render_llmapi,
    render_trtllm,
)
from build_engines.spec import BuildSpec
from replicas.render import CpuEngineModelSettings

# What the rendered trtllm config shows for the engine's digest before the engine exists (dry run).
ENGINE_DIGEST_PENDING = "(the built engine's sha256, computed after trtllm-build)"
FP8_CALIB_SIZE = 512  # ModelOpt's calibration samples (its examples' default)
# How many steps each target's plan has (the progress lines number them; the fetch is logged before
# the plan exists).
STEP_COUNTS = {"cpu": 5, "trtllm-llmapi": 5, "trtllm": 8}
# convert_checkpoint.py by config.json's model_type (the check admits the Llama family only).
_FAMILY_SCRIPT = {"llama": "models/core/llama", "mistral": "models/core/llama"}


@dataclass(frozen=True)
class Step:
    name: str
    summary: str  # one readable line, logged when the step starts
    command: tuple[str, ...] = ()  # the program run, exactly; () for a step done in-process


@dataclass(frozen=True)
class BuildPlan:
    spec: BuildSpec
    source_dir: Path  # the fetched checkpoint
    work_dir: Path  # scratch: converted checkpoint, engine, rendered repository
    artifact_dir: Path  # what is uploaded to spec.dest
    build_config: dict[str, Any]  # resolved (dtype chosen): what the manifest and the registry record
    tool_versions: dict[str, str]
    steps: tuple[Step, ...]
    source_weights_digest: str  # sluice.weights_digest of the fetched checkpoint
    rendered: dict[str, str] = field(default_factory=dict)  # repository-relative path -> text

    @property
    def repository_dir(self) -> Path:
        return self.work_dir / "repository"

    def describe(self) -> str:
        """The plan as an operator reads it: steps with their commands, then each rendered file."""
        spec = self.spec
        lines = [
            f"Build plan: {spec.model}@{spec.version}, target {spec.target}",
            f"  source   {spec.source_uri}  (read from {self.source_dir})",
            f"  artifact {spec.dest}  (uploaded from {self.artifact_dir})",
            f"  build config {_json(self.build_config)}",
            f"  tools {_json(self.tool_versions)}",
            "Steps:",
        ]
        for number, step in enumerate(self.steps, 1):
            lines.append(f"  {number}. {step.name}: {step.summary}")
            if step.command:
                lines.append(f"       $ {' '.join(shlex.quote(part) for part in step.command)}")
        for path, text in self.rendered.items():
            lines += [f"--- {path} ---", text.rstrip("\n")]
        return "\n".join(lines)


def tool_versions(target: str) -> dict[str, str]:
    """The versions that make two builds of the same inputs the same build."""
    versions = {"sluice": _version("sluice")}
    if target != "cpu":
        versions["tensorrt_llm"] = _version("tensorrt_llm")
    return versions


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def resolved_dtype(spec: BuildSpec, info: CheckpointInfo) -> str:
    """The dtype the build uses: the CPU engine resolves "auto" itself at load; the TensorRT-LLM
    targets take the checkpoint's own, float32 made float16 (convert_checkpoint.py's and quantize.py's
    own rule for --dtype auto: "if the source dtype is float32, it is converted to float16"), and
    float16 when it names none. Resolved here so the registry records what was built."""
    if spec.target == "cpu" or spec.dtype != "auto":
        return spec.dtype
    own = info.torch_dtype if info.torch_dtype in ("float16", "bfloat16") else "float16"
    return own


def plan_build(
    spec: BuildSpec,
    *,
    source_dir: Path,
    info: CheckpointInfo,
    work_dir: Path,
    source_weights_digest: str,
    versions: dict[str, str],
    trtllm_examples: Path,
    calib_dir: str | None = None,
) -> BuildPlan:
    """The plan for ``spec`` from the fetched, checked checkpoint (pure: see the module docstring)."""
    config = {**spec.build_config(), "dtype": resolved_dtype(spec, info)}
    digest = source_weights_digest
    if spec.is_local_source:
        fetch = Step("fetch", f"read the local checkpoint {source_dir} (dry run: no weight store)")
    else:
        fetch = Step(
            "fetch", f"fetch {spec.source} into {source_dir} (every file checked against its manifest)"
        )
    check = Step(
        "check",
        f"check {info.model_type} checkpoint: {info.num_hidden_layers} layers, hidden {info.hidden_size}, "
        f"vocab {info.vocab_size}, {info.num_tensors} tensors with the shapes config.json implies",
    )
    upload = Step("upload", f"upload the artifact to {spec.dest} with its manifest")
    register = Step("register", f"register {spec.model}@{spec.version} as staged with its weights digest")
    repo = work_dir / "repository"
    if spec.target == "cpu":
        settings = CpuEngineModelSettings(
            checkpoint_dir=source_dir,
            model_name=spec.model,
            model_version=spec.triton_version,
            weights_digest=source_weights_digest,
            dtype=config["dtype"],
        )
        render = Step(
            "render", f"render the CPU engine's model repository into {repo} (dtype {config['dtype']})"
        )
        steps = (fetch, check, render, upload, register)
        assert len(steps) == STEP_COUNTS["cpu"]
        rendered = render_cpu(settings)
        return BuildPlan(spec, source_dir, work_dir, source_dir, config, versions, steps, digest, rendered)
    if spec.target == "trtllm-llmapi":
        rendered = render_llmapi(
            model_name=spec.model,
            triton_version=spec.triton_version,
            checkpoint_dir=str(source_dir),
            weights_digest_value=source_weights_digest,
            build_config=config,
        )
        render = Step("render", f"render the llmapi model (config.pbtxt, model.yaml) into {repo}")
        steps = (fetch, check, render, upload, register)
        assert len(steps) == STEP_COUNTS["trtllm-llmapi"]
        return BuildPlan(spec, source_dir, work_dir, source_dir, config, versions, steps, digest, rendered)
    plan = _plan_trtllm(
        spec, config, source_dir, work_dir, info, versions, trtllm_examples, calib_dir, (fetch, check)
    )
    return replace(plan, source_weights_digest=digest)


def _plan_trtllm(
    spec: BuildSpec,
    config: dict[str, Any],
    source_dir: Path,
    work_dir: Path,
    info: CheckpointInfo,
    versions: dict[str, str],
    examples: Path,
    calib_dir: str | None,
    steps: tuple[Step, ...],
) -> BuildPlan:
    checkpoint, artifact = work_dir / "trtllm_checkpoint", work_dir / "artifact"
    engine = artifact / ENGINE_SUBDIR
    dtype, tp, pp = config["dtype"], str(spec.tp_size), str(spec.pp_size)
    if spec.quantization == "fp8":
        assert calib_dir is not None  # BuildSpec refuses fp8 without --calib-dataset
        convert = Step(
            "quantize",
            f"quantize to FP8 with ModelOpt ({FP8_CALIB_SIZE} samples of {spec.calib_dataset}): "
            "TensorRT-LLM checkpoint",
            (
                sys.executable,
                str(examples / "quantization" / "quantize.py"),
                "--model_dir", str(source_dir),
                "--dtype", dtype,
                "--qformat", "fp8",
                "--kv_cache_dtype", "fp8",
                "--calib_dataset", calib_dir,
                "--calib_size", str(FP8_CALIB_SIZE),
                "--tp_size", tp,
                "--pp_size", pp,
                "--output_dir", str(checkpoint),
            ),
        )  # fmt: skip
    else:
        convert = Step(
            "convert",
            f"convert the {info.model_type} checkpoint to a TensorRT-LLM checkpoint ({dtype}, tp {tp}, "
            f"pp {pp})",
            (
                sys.executable,
                str(examples / _FAMILY_SCRIPT[info.model_type] / "convert_checkpoint.py"),
                "--model_dir", str(source_dir),
                "--output_dir", str(checkpoint),
                "--dtype", dtype,
                "--tp_size", tp,
                "--pp_size", pp,
            ),
        )  # fmt: skip
    build = Step(
        "build",
        "build the engine: paged KV cache, paged context FMHA, in-flight batching limits",
        (
            "trtllm-build",
            "--checkpoint_dir", str(checkpoint),
            "--output_dir", str(engine),
            "--gemm_plugin", "auto",
            "--kv_cache_type", "paged",
            "--use_paged_context_fmha", "enable",
            "--max_batch_size", str(spec.max_batch_size),
            "--max_num_tokens", str(spec.max_num_tokens),
            "--max_input_len", str(spec.max_input_len),
            "--max_seq_len", str(spec.max_seq_len),
            "--workers", str(spec.world_size),
        ),
    )  # fmt: skip
    stage = Step(
        "stage",
        f"copy the tokenizer beside the engine in {artifact}; read the engine's limits from its "
        "config.json; digest the engine",
    )
    render = Step(
        "render", f"render the inflight_batcher_llm tensorrt_llm model into {work_dir / 'repository'}"
    )
    # Structured output on: the render step writes the staged tokenizer's info file beside the config
    # (build_engines.guided_decoding; the check requires a tokenizer.json).
    info_path = work_dir / "repository" / spec.model / XGRAMMAR_TOKENIZER_INFO
    rendered = render_trtllm(
        model_name=spec.model,
        triton_version=spec.triton_version,
        engine_dir=str(engine),
        weights_digest_value=ENGINE_DIGEST_PENDING,
        max_batch_size=spec.max_batch_size,
        serving=guided_serving(info_path),
    )
    upload = Step("upload", f"upload the artifact to {spec.dest} with its manifest")
    register = Step("register", f"register {spec.model}@{spec.version} as staged with the engine's digest")
    all_steps = (*steps, convert, build, stage, render, upload, register)
    assert len(all_steps) == STEP_COUNTS["trtllm"]
    return BuildPlan(spec, source_dir, work_dir, artifact, config, versions, all_steps, "", rendered)


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True)
