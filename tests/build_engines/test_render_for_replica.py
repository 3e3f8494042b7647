"""``render_for_replica``: the repository a replica renders at start from its cached artifact, for the
two TensorRT-LLM layouts (no GPU needed to render). The engine files and the llmapi ``model.py`` are
fakes (bytes standing in for trtllm-build's output and TensorRT-LLM's file): only their paths and
digests matter here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from build_engines.repository import render_for_replica
from sluice.weights_digest import weights_digest

TRTLLM_CONFIG = {
    "target": "trtllm",
    "dtype": "bfloat16",
    "quantization": None,
    "tp_size": 1,
    "pp_size": 1,
    "max_batch_size": 48,
    "max_num_tokens": 8192,
    "max_input_len": 4096,
    "max_seq_len": 8192,
}


def fake_trtllm_artifact(root: Path, world_size: int = 1) -> Path:
    (root / "engine").mkdir(parents=True)
    (root / "engine" / "rank0.engine").write_bytes(b"fake engine bytes")
    engine_config = {
        "version": "1.2.0",
        "pretrained_config": {"mapping": {"world_size": world_size, "tp_size": world_size, "pp_size": 1}},
        "build_config": {"max_batch_size": 48, "max_input_len": 4096, "max_seq_len": 8192},
    }
    (root / "engine" / "config.json").write_text(json.dumps(engine_config))
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_text("{}")
    return root


def test_trtllm_renders_the_engine_path_and_the_engines_digest(tmp_path: Path) -> None:
    artifact = fake_trtllm_artifact(tmp_path / "artifact")
    digest = weights_digest(artifact / "engine")
    model_dir = render_for_replica(
        artifact, tmp_path / "repo", "llama-8b", "3", TRTLLM_CONFIG, expected_digest=digest
    )
    config = (model_dir / "config.pbtxt").read_text()
    assert "${" not in config and "max_batch_size: 48" in config and "versions: [ 3 ]" in config
    params = dict(re.findall(r'key: "([^"]+)" value: \{ string_value: "([^"]*)" \}', config))
    assert params["gpt_model_path"] == str((artifact / "engine").resolve())
    assert params["weights_digest"] == digest
    assert (model_dir / "3").is_dir()  # the backend needs the version folder, empty


def test_a_digest_other_than_the_registrys_is_refused_before_writing(tmp_path: Path) -> None:
    artifact = fake_trtllm_artifact(tmp_path / "artifact")
    with pytest.raises(ValueError, match="the registry's version has sha256:0000"):
        render_for_replica(
            artifact, tmp_path / "repo", "m", "1", TRTLLM_CONFIG, expected_digest="sha256:" + "0" * 64
        )
    assert not (tmp_path / "repo").exists()


def test_an_engine_built_for_other_ranks_than_the_version_records_is_refused(tmp_path: Path) -> None:
    artifact = fake_trtllm_artifact(tmp_path / "artifact", world_size=2)
    with pytest.raises(ValueError, match=r"built for 2 GPU ranks.*tp_size x pp_size = 1"):
        render_for_replica(artifact, tmp_path / "repo", "m", "1", TRTLLM_CONFIG)
    model_dir = render_for_replica(artifact, tmp_path / "repo", "m", "1", {**TRTLLM_CONFIG, "tp_size": 2})
    assert (model_dir / "config.pbtxt").is_file()


def test_llmapi_renders_model_yaml_beside_tensorrt_llms_model_py_and_helpers(
    tmp_path: Path, dev_checkpoint: Path
) -> None:
    llmapi = tmp_path / "llmapi"  # stands in for TensorRT-LLM's llmapi/tensorrt_llm/1/
    llmapi.mkdir()
    (llmapi / "model.py").write_text("from helpers import get_input_tensor_by_name\n")
    build_config = {**TRTLLM_CONFIG, "target": "trtllm-llmapi", "tp_size": 2, "pp_size": 2}
    # model.py imports helpers.py from beside it: without it the model would not load.
    with pytest.raises(ValueError, match=r"model\.py and helpers\.py .* lacks helpers\.py"):
        render_for_replica(
            dev_checkpoint, tmp_path / "repo", "tiny", "2", build_config, llmapi_model_dir=llmapi
        )
    (llmapi / "helpers.py").write_text("def get_input_tensor_by_name(): ...\n")
    model_dir = render_for_replica(
        dev_checkpoint, tmp_path / "repo", "tiny", "2", build_config, llmapi_model_dir=llmapi
    )
    model_yaml = (model_dir / "2" / "model.yaml").read_text()
    assert f'model: "{dev_checkpoint.resolve()}"' in model_yaml
    assert "tensor_parallel_size: 2" in model_yaml and "pipeline_parallel_size: 2" in model_yaml
    assert 'dtype: "bfloat16"' in model_yaml
    for name in ("model.py", "helpers.py"):
        assert (model_dir / "2" / name).read_text() == (llmapi / name).read_text()
    assert weights_digest(dev_checkpoint) in (model_dir / "config.pbtxt").read_text()
