"""FAKE TensorRT-LLM tools, for tests only (these machines have no GPU and no TensorRT-LLM): a fake
``nvidia-smi`` listing one GPU, a fake ``tensorrt_llm`` package (version 1.2.0+fake), a fake
``convert_checkpoint.py`` and a fake ``trtllm-build`` that record their arguments and write stand-in files
(the engine's ``config.json`` with the limits it was given, as trtllm-build writes it). They let the real
build pipeline run around them; they build nothing."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

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


def install_fake_tensorrt_llm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trtllm_version: str = "1.2.0+fake"
) -> Path:
    """Fake tools on PATH and a fake tensorrt_llm package (``trtllm_version``) on sys.path, under
    ``tmp_path``; returns the fake examples folder."""
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
        f"Name: tensorrt_llm\nVersion: {trtllm_version}\n"
    )
    convert = examples / "models" / "core" / "llama" / "convert_checkpoint.py"
    convert.parent.mkdir(parents=True)
    convert.write_text(FAKE_CONVERT)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.syspath_prepend(str(site))
    return examples
