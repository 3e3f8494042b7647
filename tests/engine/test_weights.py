"""The torch-free safetensors reader and the engine's weight layout."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from cpu_engine.config import ModelConfig
from cpu_engine.weights import load_llama_weights, load_tensors, read_safetensors

TINY = {
    "vocab_size": 32,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
}


def tiny_config(**overrides: object) -> ModelConfig:
    return ModelConfig.from_dict({**TINY, **overrides})


def tiny_tensors(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """HF-named float32 tensors for cfg, with lm_head.weight."""
    rng = np.random.default_rng(seed)
    h, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    shapes["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def test_reader_matches_reference_f32(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    tensors = {
        "matrix": rng.standard_normal((7, 5)).astype(np.float32),
        "vector": rng.standard_normal(3).astype(np.float32),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "cube": rng.standard_normal((2, 3, 4)).astype(np.float32),
    }
    save_file(tensors, str(tmp_path / "x.safetensors"), metadata={"format": "pt"})
    ours, ref = read_safetensors(tmp_path / "x.safetensors"), load_file(str(tmp_path / "x.safetensors"))
    assert sorted(ours) == sorted(ref)
    for name in ref:
        assert ours[name].dtype == np.float32 and ours[name].shape == ref[name].shape
        assert np.array_equal(ours[name], ref[name]), name
    assert list(read_safetensors(tmp_path / "x.safetensors", ["vector"])) == ["vector"]
    with pytest.raises(ValueError, match="'nope'"):
        read_safetensors(tmp_path / "x.safetensors", ["nope"])


@pytest.mark.parametrize("dtype_name", ["bfloat16", "float16"])
def test_half_precision_decodes_exactly(tmp_path: Path, dtype_name: str) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    dtype = getattr(torch, dtype_name)
    finfo = torch.finfo(dtype)
    special = torch.tensor([0.0, -0.0, 1.0, -2.5, finfo.max, finfo.min, finfo.tiny, finfo.tiny / 4])
    special = torch.cat([special, torch.tensor([float("inf"), float("-inf")])]).to(dtype)
    wide = torch.randn(33, 17, generator=torch.manual_seed(0)) * 50
    values = {"special": special, "random": wide.to(dtype)}
    save_torch(values, str(tmp_path / "h.safetensors"))
    ours = read_safetensors(tmp_path / "h.safetensors")
    for name, tensor in values.items():
        expected = tensor.float().numpy()
        assert ours[name].dtype == np.float32
        # Compare bits, so -0.0, subnormals and infinities must match exactly too.
        assert np.array_equal(ours[name].view(np.uint32), expected.view(np.uint32)), name


def test_bf16_nan_stays_nan(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file as save_torch

    nan_one = torch.tensor([float("nan"), 1.0], dtype=torch.bfloat16)
    save_torch({"n": nan_one}, str(tmp_path / "n.safetensors"))
    out = read_safetensors(tmp_path / "n.safetensors")["n"]
    assert np.isnan(out[0]) and out[1] == 1.0


def test_unsupported_dtype_and_corrupt_file(tmp_path: Path) -> None:
    save_file({"ids": np.arange(4, dtype=np.int64)}, str(tmp_path / "i.safetensors"))
    with pytest.raises(ValueError, match=r"'ids'.*I64"):
        read_safetensors(tmp_path / "i.safetensors")
    (tmp_path / "short.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        read_safetensors(tmp_path / "short.safetensors")
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        read_safetensors(tmp_path / "huge.safetensors")
    header = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (tmp_path / "cut.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
    with pytest.raises(ValueError, match="offsets"):
        read_safetensors(tmp_path / "cut.safetensors")


def test_layout_is_transposed_and_fused(tmp_path: Path) -> None:
    cfg = tiny_config()
    raw = tiny_tensors(cfg)
    save_file(raw, str(tmp_path / "model.safetensors"))
    w = load_llama_weights(tmp_path, cfg)
    assert len(w.layers) == 2
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        qkv = [raw[p + f"self_attn.{x}_proj.weight"].T for x in "qkv"]
        assert layer.wqkv.shape == (16, (4 + 2 * 2) * 4)
        assert np.array_equal(layer.wqkv, np.concatenate(qkv, axis=1))
        assert np.array_equal(layer.w_gate_up[:, :24], raw[p + "mlp.gate_proj.weight"].T)
        assert np.array_equal(layer.w_gate_up[:, 24:], raw[p + "mlp.up_proj.weight"].T)
        assert np.array_equal(layer.wo, raw[p + "self_attn.o_proj.weight"].T)
        assert np.array_equal(layer.w_down, raw[p + "mlp.down_proj.weight"].T)
        assert np.array_equal(layer.input_norm, raw[p + "input_layernorm.weight"])
        assert np.array_equal(layer.post_attn_norm, raw[p + "post_attention_layernorm.weight"])
        for arr in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            assert arr.flags.c_contiguous and arr.dtype == np.float32
    assert np.array_equal(w.embed, raw["model.embed_tokens.weight"])
    assert np.array_equal(w.final_norm, raw["model.norm.weight"])
    assert w.lm_head.shape == (16, 32) and w.lm_head.flags.c_contiguous
    assert np.array_equal(w.lm_head, raw["lm_head.weight"].T)


@pytest.mark.parametrize("tied_in_config", [True, False])
def test_tied_or_missing_lm_head_uses_embedding(tmp_path: Path, tied_in_config: bool) -> None:
    cfg = tiny_config(tie_word_embeddings=tied_in_config)
    raw = tiny_tensors(cfg)
    del raw["lm_head.weight"]
    save_file(raw, str(tmp_path / "model.safetensors"))
    w = load_llama_weights(tmp_path, cfg)
    assert w.lm_head.flags.c_contiguous and np.array_equal(w.lm_head, raw["model.embed_tokens.weight"].T)


def test_sharded_checkpoint(tmp_path: Path) -> None:
    cfg = tiny_config()
    raw = tiny_tensors(cfg)
    names = sorted(raw)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, shard_names in shards.items():
        save_file({n: raw[n] for n in shard_names}, str(tmp_path / shard))
    weight_map = {n: shard for shard, shard_names in shards.items() for n in shard_names}
    index = {"metadata": {}, "weight_map": weight_map}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = load_tensors(tmp_path)
    assert sorted(loaded) == names and all(np.array_equal(loaded[n], raw[n]) for n in names)
    assert np.array_equal(load_llama_weights(tmp_path, cfg).lm_head, raw["lm_head.weight"].T)


def test_misshaped_missing_and_bias_tensors_are_clear_errors(tmp_path: Path) -> None:
    cfg = tiny_config()
    raw = tiny_tensors(cfg)
    raw["model.layers.1.self_attn.k_proj.weight"] = raw["model.layers.1.self_attn.k_proj.weight"].T.copy()
    save_file(raw, str(tmp_path / "model.safetensors"))
    name = re.escape("'model.layers.1.self_attn.k_proj.weight'")
    with pytest.raises(ValueError, match=name + r".*expected \[8, 16\]"):
        load_llama_weights(tmp_path, cfg)

    raw = tiny_tensors(cfg)
    del raw["model.layers.0.mlp.up_proj.weight"]
    save_file(raw, str(tmp_path / "model.safetensors"))
    name = re.escape("'model.layers.0.mlp.up_proj.weight'")
    with pytest.raises(ValueError, match="missing tensor " + name + r".*\[24, 16\]"):
        load_llama_weights(tmp_path, cfg)

    raw = tiny_tensors(cfg) | {"model.layers.0.self_attn.q_proj.bias": np.zeros(16, np.float32)}
    save_file(raw, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="biases"):
        load_llama_weights(tmp_path, cfg)

    with pytest.raises(FileNotFoundError):
        load_tensors(tmp_path / "nowhere")


def test_dev_checkpoint_loads(dev_checkpoint: Path) -> None:
    cfg = ModelConfig.from_checkpoint(dev_checkpoint)
    w = load_llama_weights(dev_checkpoint, cfg)
    assert len(w.layers) == 4 and w.embed.shape == (8192, 256) and w.lm_head.shape == (256, 8192)
    assert w.layers[0].wqkv.shape == (256, 512) and w.layers[0].w_gate_up.shape == (256, 1376)
    assert w.layers[0].wo.shape == (256, 256) and w.layers[0].w_down.shape == (688, 256)
