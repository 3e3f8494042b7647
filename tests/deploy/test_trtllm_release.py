"""One TensorRT-LLM release, stated once (build_engines/trtllm_release.py): every Dockerfile, the kustomize
base, the build plan's default examples/ path and the docs name the same NGC image tag, TensorRT-LLM
version and git tag, and no other Triton TensorRT-LLM tag appears anywhere they are described."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from build_engines import trtllm_release as release
from build_engines.pipeline import DEFAULT_TRTLLM_EXAMPLES

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
# Where a Triton TensorRT-LLM image tag or a TensorRT-LLM version may be written down.
DESCRIBED_IN = [
    ROOT / "README.md",
    ROOT / "docs" / "operations.md",
    ROOT / "docs" / "architecture.md",
    ROOT / "build_engines" / "README.md",
    ROOT / "deploy" / "docker" / "README.md",
    ROOT / "deploy" / "kubernetes" / "README.md",
    *sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile")),
    *sorted((ROOT / "deploy" / "kubernetes").rglob("*.yaml")),
]
_TAG = re.compile(r"\b\d{2}\.\d{2}-trtllm-python-py3\b")


def _arg(dockerfile: Path, name: str) -> str:
    (value,) = re.findall(rf"^ARG {name}=(\S+)$", dockerfile.read_text(), flags=re.M)
    return value


def test_the_release_module_is_consistent_with_ngcs_image_to_version_mapping() -> None:
    # NGC: 25.12-26.02 carry TensorRT-LLM 1.1.0, 26.03 carries 1.2.0, 26.04 and later 1.2.1.
    ngc = {"25.12": "1.1.0", "26.01": "1.1.0", "26.02": "1.1.0", "26.03": "1.2.0", "26.04": "1.2.1"}
    assert ngc[release.TRITON_TAG.split("-")[0]] == release.TRTLLM_VERSION
    assert f"v{release.TRTLLM_VERSION}" == release.TRTLLM_GIT_TAG


def test_the_dockerfiles_build_on_the_pinned_image_and_add_the_pinned_sources() -> None:
    build = DOCKER / "build-engine.Dockerfile"
    assert _arg(build, "TRITON_TAG") == release.TRITON_TAG
    assert _arg(build, "TRTLLM_GIT_TAG") == release.TRTLLM_GIT_TAG
    assert f"FROM {release.TRITON_IMAGE}:${{TRITON_TAG}}" in build.read_text()
    assert f":examples {release.EXAMPLES_DIR}\n" in build.read_text()
    control = DOCKER / "control-plane.Dockerfile"
    assert _arg(control, "TRTLLM_GIT_TAG") == release.TRTLLM_GIT_TAG
    (added,) = re.findall(r"^ADD \S+:triton_backend/all_models/llmapi (\S+)$", control.read_text(), re.M)
    assert Path(added) / "tensorrt_llm" / "1" == release.LLMAPI_MODEL_DIR


def test_kustomize_serves_the_image_the_engines_are_built_in() -> None:
    base = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "base" / "kustomization.yaml").read_text())
    (image,) = [i for i in base["images"] if i["name"] == "tritonserver-trtllm"]
    assert (image["newName"], image["newTag"]) == (release.TRITON_IMAGE, release.TRITON_TAG)


def test_the_build_plan_runs_the_examples_the_image_carries() -> None:
    assert release.EXAMPLES_DIR == DEFAULT_TRTLLM_EXAMPLES


def test_no_document_or_manifest_names_another_image_tag_or_version() -> None:
    for path in DESCRIBED_IN:
        text = path.read_text()
        tags = set(_TAG.findall(text))
        assert tags <= {release.TRITON_TAG}, f"{path.relative_to(ROOT)} names {sorted(tags)}"
        versions = set(re.findall(r"TensorRT-LLM (\d+\.\d+(?:\.\d+)?)", text))
        mapping_note = "25.12" in text  # the NGC mapping table may name the other releases
        assert mapping_note or versions <= {release.TRTLLM_VERSION}, f"{path.relative_to(ROOT)}: {versions}"
    docs = (ROOT / "docs" / "operations.md").read_text()
    assert release.TRITON_TAG in docs and f"TensorRT-LLM {release.TRTLLM_VERSION}" in docs
