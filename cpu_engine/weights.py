"""Load a Llama checkpoint's weights into numpy, without torch.

`read_safetensors(file)` parses one safetensors file (u64 little-endian header length, JSON header,
data) into float32 arrays. `load_tensors(path)` does the same for a checkpoint directory, sharded
(`model.safetensors.index.json`) or not. `load_llama_weights(path, cfg)` lays the tensors out for the
engine: linear weights transposed to [in, out] so a layer is `x @ W`, q/k/v and gate/up fused.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from cpu_engine.config import ModelConfig

F32Array = npt.NDArray[np.float32]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Safetensors stores little-endian data; BF16 has no numpy dtype and is decoded by hand.
_DTYPES: dict[str, np.dtype[Any]] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}
# A header larger than this is a corrupt file, not a model (the reference reader uses the same bound).
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def _decode(raw: bytes | mmap.mmap, offset: int, dtype: str, shape: list[int]) -> F32Array:
    count = int(np.prod(shape, dtype=np.int64))
    arr = np.frombuffer(raw, dtype=_DTYPES[dtype], count=count, offset=offset)
    if dtype == "BF16":
        # bfloat16 is the top half of a float32: widen the bits, shift into place, reinterpret.
        return (arr.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return arr.astype(np.float32).reshape(shape)  # astype copies: nothing keeps the mapping alive


def read_safetensors(file: str | Path, names: Iterable[str] | None = None) -> dict[str, F32Array]:
    """Read the tensors of one safetensors file (all, or just `names`) as float32 arrays.

    Supports F32, F16 and BF16; any other dtype, a missing name, or an inconsistent header is a ValueError.
    """
    file = Path(file)
    if file.stat().st_size < 8:
        raise ValueError(f"{file}: too short to be a safetensors file")
    with open(file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        (header_len,) = struct.unpack("<Q", mm[:8])
        if header_len > min(_MAX_HEADER_BYTES, len(mm) - 8):
            raise ValueError(f"{file}: header length {header_len} exceeds the file")
        header: dict[str, Any] = json.loads(mm[8 : 8 + header_len])
        header.pop("__metadata__", None)
        data_start = 8 + header_len
        data_len = len(mm) - data_start
        wanted = sorted(header) if names is None else list(names)
        out: dict[str, F32Array] = {}
        for name in wanted:
            if name not in header:
                raise ValueError(f"{file}: no tensor named {name!r}")
            info = header[name]
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
            if dtype not in _DTYPES:
                raise ValueError(f"{file}: tensor {name!r} has unsupported dtype {dtype} (want F32/F16/BF16)")
            nbytes = int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype].itemsize
            if not 0 <= begin <= end <= data_len or end - begin != nbytes:
                raise ValueError(f"{file}: tensor {name!r} offsets {[begin, end]} do not fit {dtype}{shape}")
            out[name] = _decode(mm, data_start + begin, dtype, shape)
        return out


def load_tensors(path: str | Path) -> dict[str, F32Array]:
    """All tensors of a checkpoint as float32: a .safetensors file, or a directory holding either
    model.safetensors.index.json (sharded; shards read in sorted order) or model.safetensors."""
    path = Path(path)
    if path.is_file():
        return read_safetensors(path)
    index = path / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        by_shard: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            by_shard.setdefault(shard, []).append(name)
        out: dict[str, F32Array] = {}
        for shard in sorted(by_shard):
            out.update(read_safetensors(path / shard, by_shard[shard]))
        return out
    if (path / SINGLE_FILE).is_file():
        return read_safetensors(path / SINGLE_FILE)
    raise FileNotFoundError(f"{path}: neither {INDEX_FILE} nor {SINGLE_FILE} found")


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer. Linear weights are [in, out], C-contiguous float32."""

    input_norm: F32Array  # [hidden]
    wqkv: F32Array  # [hidden, (num_heads + 2 * num_kv_heads) * head_dim]: q, then k, then v
    wo: F32Array  # [num_heads * head_dim, hidden]
    post_attn_norm: F32Array  # [hidden]
    w_gate_up: F32Array  # [hidden, 2 * intermediate]: gate, then up
    w_down: F32Array  # [intermediate, hidden]


@dataclass(frozen=True)
class LlamaWeights:
    embed: F32Array  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: F32Array  # [hidden]
    lm_head: F32Array  # [hidden, vocab]


class _Taker:
    """Pops tensors by name, checking each against the shape the config implies."""

    def __init__(self, tensors: dict[str, F32Array]) -> None:
        self.tensors = tensors

    def take(self, name: str, shape: tuple[int, ...]) -> F32Array:
        if name not in self.tensors:
            raise ValueError(f"checkpoint is missing tensor {name!r} (expected shape {list(shape)})")
        arr = self.tensors.pop(name)
        if arr.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {list(arr.shape)}, expected {list(shape)}")
        return arr

    def linear_t(self, name: str, out_features: int, in_features: int) -> F32Array:
        """An HF Linear weight ([out, in]) transposed to [in, out]."""
        return self.take(name, (out_features, in_features)).T


def _contig(arr: F32Array) -> F32Array:
    return np.ascontiguousarray(arr, dtype=np.float32)


def _fuse(*parts: F32Array) -> F32Array:
    """Concatenate [in, out_k] matrices along the output axis into one [in, sum(out_k)] matrix."""
    return _contig(np.concatenate(parts, axis=1))


def load_llama_weights(path: str | Path, cfg: ModelConfig) -> LlamaWeights:
    """Load and lay out a Llama checkpoint for the engine. Missing or mis-shaped tensors are a ValueError
    naming the tensor and the expected shape; the output head falls back to the embedding's transpose
    when the config ties them or lm_head.weight is absent."""
    tensors = load_tensors(path)
    biases = sorted(n for n in tensors if n.endswith("_proj.bias"))
    if biases:
        # Dropping them silently would give wrong outputs; the engine's layers have no bias term.
        raise ValueError(f"projection biases are not supported by the CPU engine: {biases[:3]}")
    t = _Taker(tensors)
    h, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    q_dim, kv_dim = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        layers.append(
            LayerWeights(
                input_norm=t.take(p + "input_layernorm.weight", (h,)),
                wqkv=_fuse(
                    t.linear_t(p + "self_attn.q_proj.weight", q_dim, h),
                    t.linear_t(p + "self_attn.k_proj.weight", kv_dim, h),
                    t.linear_t(p + "self_attn.v_proj.weight", kv_dim, h),
                ),
                wo=_contig(t.linear_t(p + "self_attn.o_proj.weight", h, q_dim)),
                post_attn_norm=t.take(p + "post_attention_layernorm.weight", (h,)),
                w_gate_up=_fuse(
                    t.linear_t(p + "mlp.gate_proj.weight", inter, h),
                    t.linear_t(p + "mlp.up_proj.weight", inter, h),
                ),
                w_down=_contig(t.linear_t(p + "mlp.down_proj.weight", h, inter)),
            )
        )
    embed = t.take("model.embed_tokens.weight", (cfg.vocab_size, h))
    final_norm = t.take("model.norm.weight", (h,))
    if cfg.tie_word_embeddings or "lm_head.weight" not in tensors:
        lm_head = _contig(embed.T)
    else:
        lm_head = _contig(t.linear_t("lm_head.weight", cfg.vocab_size, h))
    return LlamaWeights(embed=_contig(embed), layers=layers, final_norm=final_norm, lm_head=lm_head)
