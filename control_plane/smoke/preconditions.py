"""What a node must have before ``sluice trtllm-smoke`` builds or starts anything: an NVIDIA GPU, the
TensorRT-LLM release Sluice pins (``build_engines.trtllm_release``), the release's ``examples/`` (its
convert script), and an NGC Triton image's own ``tritonserver`` with the TensorRT-LLM backend. Every
missing one is named, so one run tells a platform team all that is wrong with the node.
"""

from __future__ import annotations

from pathlib import Path

from build_engines.pipeline import examples_problem, installed_trtllm, nvidia_gpu_problem
from build_engines.spec import BuildSpec
from build_engines.trtllm_release import TRITON_IMAGE_REF, version_problem
from replicas.launcher import IMAGE_TRITON_ROOT


def triton_problem(root: Path = IMAGE_TRITON_ROOT) -> str | None:
    """Why ``root`` holds no tritonserver that can load a TensorRT-LLM engine, or None."""
    binary = root / "bin" / "tritonserver"
    if not binary.is_file():
        return f"no tritonserver at {binary}: run inside {TRITON_IMAGE_REF}"
    backend = root / "backends" / "tensorrtllm"
    if not backend.is_dir():
        return f"{binary} has no TensorRT-LLM backend ({backend} is missing): use a -trtllm- image"
    return None


def node_problems(spec: BuildSpec, *, examples: Path, triton_root: Path = IMAGE_TRITON_ROOT) -> list[str]:
    """Every reason this node cannot build ``spec`` and serve it; empty when it can."""
    problems = [
        nvidia_gpu_problem(),
        version_problem(installed_trtllm()),
        triton_problem(triton_root),
        examples_problem(spec, examples),
    ]
    return [p for p in problems if p is not None]
