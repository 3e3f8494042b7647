"""The build's checkpoint check (headers only) against the CPU engine's loader (every tensor read): both
accept the dev checkpoint and both refuse each broken variant, so the restated rules cannot drift."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from build_engines.checkpoint import CheckpointError, check_checkpoint
from cpu_engine.config import ModelConfig
from cpu_engine.weights import load_llama_weights

Tensors = dict[str, np.ndarray[Any, Any]]


def engine_loads(directory: Path) -> None:
    load_llama_weights(directory, ModelConfig.from_checkpoint(directory))


def variant(
    source: Path,
    out: Path,
    config: dict[str, Any] | None = None,
    tensors: Callable[[Tensors], None] | None = None,
) -> Path:
    shutil.copytree(source, out)
    if config is not None:
        raw = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**raw, **config}))
    if tensors is not None:
        loaded = load_file(out / "model.safetensors")
        tensors(loaded)
        (out / "model.safetensors").unlink()
        save_file(loaded, out / "model.safetensors")
    return out


def _drop(name: str) -> Callable[[Tensors], None]:
    def drop(t: Tensors) -> None:
        del t[name]

    return drop


def _bias(t: Tensors) -> None:
    t["model.layers.0.self_attn.q_proj.bias"] = np.zeros(256, dtype=np.float32)


def _reshape(t: Tensors) -> None:
    t["model.layers.1.mlp.down_proj.weight"] = t["model.layers.1.mlp.down_proj.weight"][:, :-1].copy()


CASES: dict[str, tuple[dict[str, Any] | None, Callable[[Tensors], None] | None, str | None]] = {
    "ok": (None, None, None),
    "missing tensor": (None, _drop("model.layers.2.self_attn.k_proj.weight"), "missing tensor"),
    "wrong shape": (None, _reshape, "has shape"),
    "config disagrees": ({"intermediate_size": 1000}, None, "has shape"),
    "projection bias": (None, _bias, "biases are not supported"),
    "other architecture": ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, None, "unsupported"),
    "sliding window": ({"sliding_window": 64, "max_position_embeddings": 2048}, None, "sliding-window"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_check_and_the_engine_agree(case: str, dev_checkpoint: Path, tmp_path: Path) -> None:
    config, tensors, message = CASES[case]
    directory = variant(dev_checkpoint, tmp_path / "ckpt", config, tensors)
    if message is None:
        info = check_checkpoint(directory)
        engine_loads(directory)
        assert (info.model_type, info.num_hidden_layers) == ("llama", 4)
        return
    with pytest.raises(CheckpointError, match=message):
        check_checkpoint(directory)
    with pytest.raises(ValueError):
        engine_loads(directory)


def test_a_checkpoint_without_weights_or_tokenizer_is_refused(dev_checkpoint: Path, tmp_path: Path) -> None:
    no_tokenizer = variant(dev_checkpoint, tmp_path / "a")
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match=r"tokenizer is missing \(tokenizer.json\)"):
        check_checkpoint(no_tokenizer)
    no_weights = variant(dev_checkpoint, tmp_path / "b")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"neither model\.safetensors\.index\.json nor"):
        check_checkpoint(no_weights)
