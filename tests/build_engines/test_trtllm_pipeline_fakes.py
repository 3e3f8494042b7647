"""The trtllm target's executor end to end with FAKE TensorRT-LLM tools (these machines have no GPU and
no TensorRT-LLM): a fake ``nvidia-smi`` listing one GPU, a fake ``tensorrt_llm`` package (version
1.2.0-fake), a fake ``convert_checkpoint.py`` and a fake ``trtllm-build`` that record their arguments and
write stand-in files. What is real: the plan's commands as run, the staging, the engine's digest, the
render, the upload to moto's S3 and the registration in a real control plane. It shows the pipeline
around the tools, not that TensorRT-LLM builds an engine (docs/operations.md says so)."""

from __future__ import annotations

import json
import os
import sys
import uuid
from importlib.metadata import version
from pathlib import Path

import httpx
import pytest
from build_service import ControlPlane

from control_plane.cli.main import main
from gateway.routing.router import read_tokenizer
from sluice.settings import get_settings
from sluice.weight_store import WeightStore
from sluice.weights_digest import weights_digest

FAKE_CONVERT = """\
import json, pathlib, sys
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
(out / "config.json").write_text("{}")
(out / "rank0.safetensors").write_bytes(b"fake converted weights")
pathlib.Path(__file__).with_suffix(".argv.json").write_text(json.dumps(args))
"""

FAKE_TRTLLM_BUILD = """\
#!{python}
import json, pathlib, sys
args = sys.argv[1:]
out = pathlib.Path(args[args.index("--output_dir") + 1])
out.mkdir(parents=True, exist_ok=True)
checkpoint = args[args.index("--checkpoint_dir") + 1]
(out / "rank0.engine").write_bytes(b"fake engine built from " + checkpoint.encode())
names = ("max_batch_size", "max_num_tokens", "max_input_len", "max_seq_len")
limits = {{k: int(args[args.index("--" + k) + 1]) for k in names}}
(out / "config.json").write_text(json.dumps({{
    "version": "1.2.0",
    "pretrained_config": {{"mapping": {{"world_size": 1, "tp_size": 1, "pp_size": 1}}}},
    "build_config": {{**limits, "max_beam_width": 1}},
}}))
pathlib.Path(__file__).with_suffix(".argv.json").write_text(json.dumps(args))
"""


@pytest.fixture
def fake_tensorrt_llm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake tools on PATH and a fake tensorrt_llm package on sys.path; returns the fake examples folder."""
    bin_dir, site, examples = tmp_path / "bin", tmp_path / "site", tmp_path / "examples"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-fake)'\n")
    build = bin_dir / "trtllm-build"
    build.write_text(FAKE_TRTLLM_BUILD.format(python=sys.executable))
    for tool in (smi, build):
        tool.chmod(0o755)
    (site / "tensorrt_llm").mkdir(parents=True)
    (site / "tensorrt_llm" / "__init__.py").write_text("")
    (site / "tensorrt_llm-1.2.0.dist-info").mkdir()
    (site / "tensorrt_llm-1.2.0.dist-info" / "METADATA").write_text(
        "Name: tensorrt_llm\nVersion: 1.2.0+fake\n"
    )
    convert = examples / "models" / "core" / "llama" / "convert_checkpoint.py"
    convert.parent.mkdir(parents=True)
    convert.write_text(FAKE_CONVERT)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(site))
    return examples


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
