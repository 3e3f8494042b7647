"""The one TensorRT-LLM release Sluice builds and serves with, stated once.

An engine loads only under the TensorRT-LLM that built it, so the build image, the replica image, the
build plan's ``examples/`` path and the docs must all name the same release. Everything that names it
reads it from here; ``tests/deploy/test_trtllm_release.py`` fails when a Dockerfile, the kustomize base
or a doc says otherwise.

NGC's Triton images carry one TensorRT-LLM each (Triton's framework support matrix): 25.12 to 26.02
carry 1.1.0, 26.03 carries 1.2.0, 26.04 and later 1.2.1. The ``examples/`` folder is not taken from the
image (the Triton TensorRT-LLM images have been reported without ``/app``: tensorrtllm_backend#721):
``deploy/docker/build-engine.Dockerfile`` adds the release's own ``examples/`` at its git tag, and the
control-plane image adds the release's ``llmapi`` Triton model (``model.py`` and ``helpers.py``).
"""

from __future__ import annotations

from pathlib import Path

TRTLLM_VERSION = "1.2.0"  # what ``import tensorrt_llm; tensorrt_llm.__version__`` says in the image
TRTLLM_GIT_TAG = f"v{TRTLLM_VERSION}"  # NVIDIA/TensorRT-LLM's tag of that release
TRITON_IMAGE = "nvcr.io/nvidia/tritonserver"
TRITON_TAG = "26.03-trtllm-python-py3"  # NGC's Triton + TensorRT-LLM 1.2.0 image
TRITON_IMAGE_REF = f"{TRITON_IMAGE}:{TRITON_TAG}"
# Where the build-engine image keeps the release's examples/ (convert_checkpoint.py, quantize.py).
EXAMPLES_DIR = Path("/opt/tensorrt_llm/examples")
# Where the control-plane image keeps the release's llmapi Triton model version folder
# (triton_backend/all_models/llmapi/tensorrt_llm/1: model.py and the helpers.py it imports).
LLMAPI_MODEL_DIR = Path("/opt/tensorrt_llm/llmapi/tensorrt_llm/1")
LLMAPI_MODEL_FILES = ("model.py", "helpers.py")


def version_problem(installed: str | None) -> str | None:
    """Why the installed ``tensorrt_llm`` cannot build for this release, or None when it can."""
    if installed is None:
        return (
            f"tensorrt_llm is not importable (run in {TRITON_IMAGE_REF}, or pip install "
            f"tensorrt-llm=={TRTLLM_VERSION})"
        )
    if installed.split("+")[0] != TRTLLM_VERSION:  # a local build tag (+...) is the same release
        return (
            f"tensorrt_llm {installed} is installed, but Sluice builds and serves with {TRTLLM_VERSION} "
            f"({TRITON_IMAGE_REF}): an engine loads only under the TensorRT-LLM that built it"
        )
    return None
