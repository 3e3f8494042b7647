"""The trtllm target's executor end to end with FAKE TensorRT-LLM tools (these machines have no GPU and
no TensorRT-LLM): a fake ``nvidia-smi`` listing one GPU, a fake ``tensorrt_llm`` package (version
1.2.0-fake), a fake ``convert_checkpoint.py`` and a fake ``trtllm-build`` that record their arguments and
write stand-in files. What is real: the plan's commands as run, the staging, the engine's digest, the
render, the upload to moto's S3 and the registration in a real control plane. It shows the pipeline
around the tools, not that TensorRT-LLM builds an engine (docs/operations.md says so)."""

from __future__ import annotations

import json
import uuid
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from build_service import ControlPlane
from fake_trtllm_tools import install_fake_tensorrt_llm

from control_plane.cli.main import main
from gateway.routing.router import read_tokenizer
from sluice.settings import get_settings
from sluice.weight_store import WeightStore
from sluice.weights_digest import weights_digest


@pytest.fixture
def fake_tensorrt_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake tools on PATH and a fake tensorrt_llm package on sys.path; returns the fake examples folder."""
    return install_fake_tensorrt_llm(tmp_path, monkeypatch)


def test_trtllm_build_runs_the_commands_uploads_the_engine_and_stages_it(
    capsys: pytest.CaptureFixture[str],
    control_plane: ControlPlane,
    source_uri: str,
    fake_tensorrt_llm: Path,
    tmp_path: Path,
) -> None:
    model = f"llama-{uuid.uuid4().hex[:8]}"
    get_settings.cache_clear()
    auth = ("--admin-url", control_plane.url, "--token", control_plane.token)
    assert main(["models", "create", model, *auth]) == 0
    work = tmp_path / "work"
    argv = [
        "build-engine",
        *("--source", source_uri, "--model", model, "--version", "1", "--target", "trtllm"),
        *("--max-batch-size", "16", "--trtllm-examples", str(fake_tensorrt_llm), "--work-dir", str(work)),
        *auth,
    ]
    get_settings.cache_clear()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0 and err == "", (out, err)
    steps = [line.split(":")[0] for line in out.splitlines() if line.startswith("[")]
    assert steps == [f"[{i}/8] {name}" for i, name in enumerate(
        ["fetch", "check", "convert", "build", "stage", "render", "upload", "register"], 1
    )]  # fmt: skip
    convert_args = json.loads(
        (fake_tensorrt_llm / "models/core/llama/convert_checkpoint.argv.json").read_text()
    )
    assert convert_args[convert_args.index("--output_dir") + 1] == f"{work}/trtllm_checkpoint"
    build_args = json.loads((tmp_path / "bin" / "trtllm-build.argv.json").read_text())
    assert build_args[build_args.index("--max_batch_size") + 1] == "16"
    engine_digest = weights_digest(work / "artifact" / "engine")
    dest = f"s3://{source_uri.split('/')[2]}/engines/{model}/1"
    manifest = WeightStore.from_settings(get_settings(), quiet=True).read_manifest(dest)
    assert sorted(e.path for e in manifest.files) == [  # the gateway's files at the top, as for cpu
        "config.json",
        "engine/config.json",
        "engine/rank0.engine",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert manifest.metadata["weights_digest"] == engine_digest
    # A gateway routes the version: it reads the tokenizer from the artifact as for a cpu build.
    codec = read_tokenizer(dest, engine_digest, lambda: WeightStore.from_settings(get_settings(), quiet=True))
    assert codec.encode("hello")
    assert manifest.metadata["tool_versions"] == {"sluice": version("sluice"), "tensorrt_llm": "1.2.0+fake"}
    config = (work / "repository" / model / "config.pbtxt").read_text()
    assert engine_digest in config and f"{work}/artifact/engine" in config

    listing = httpx.get(
        f"{control_plane.url}/admin/v1/models/{model}/versions",
        headers={"Authorization": f"Bearer {control_plane.token}"},
    ).json()["versions"]
    (staged,) = listing
    assert (staged["state"], staged["weights_digest"], staged["artifact_uri"]) == (
        "staged",
        engine_digest,
        dest,
    )
    assert staged["build_config"]["max_batch_size"] == 16 and staged["build_config"]["target"] == "trtllm"
    # The limits the gateway enforces: read back from the engine's own config.json, not the request.
    assert staged["build_config"]["engine_limits"] == {
        "max_input_len": 4096,
        "max_seq_len": 8192,
        "max_batch_size": 16,
        "max_num_tokens": 8192,
    }
    assert manifest.metadata["build_config"]["engine_limits"] == staged["build_config"]["engine_limits"]
