"""Will the engine load this checkpoint? Answered from ``config.json`` and the safetensors headers alone:
no tensor is read, nothing imports torch or the CPU engine.

``check_checkpoint(dir)`` returns a ``CheckpointInfo`` (architecture, sizes, the checkpoint's own dtype)
or raises ``CheckpointError`` naming the first problem. The rules restate the CPU engine's
(``cpu_engine.config.ModelConfig.from_dict`` and ``cpu_engine.weights.load_llama_weights``: a
Llama-family architecture, no sliding window, every tensor present with the shape the config implies, no
projection biases, F32/F16/BF16 only); tests/build_engines/test_checkpoint.py fails if they drift. The
TensorRT-LLM targets use the same check for the architecture and tensors their converters expect.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
_SUPPORTED_DTYPES = ("F32", "F16", "BF16")
_DTYPE_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class CheckpointError(ValueError):
    """The checkpoint is not one the engine loads; the message says what and where."""


@dataclass(frozen=True)
class CheckpointInfo:
    model_type: str  # config.json's model_type: "llama" or "mistral"
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    num_tensors: int
    torch_dtype: str | None  # what config.json says the weights are ("bfloat16", ...), if it says


def check_checkpoint(directory: Path) -> CheckpointInfo:
    """Check ``directory`` as the CPU engine would load it (module docstring)."""
    raw = _read_config(directory)
    shapes = _tensor_shapes(directory)
    expected = _expected_shapes(raw)
    for name, shape in expected.items():
        if name not in shapes:
            raise CheckpointError(f"{directory}: checkpoint is missing tensor {name!r} (shape {list(shape)})")
        if shapes[name] != shape:
            raise CheckpointError(
                f"{directory}: tensor {name!r} has shape {list(shapes[name])}, expected {list(shape)}"
            )
    head = shapes.get("lm_head.weight")
    if head is not None and not raw.get("tie_word_embeddings", False):
        embed = expected["model.embed_tokens.weight"]
        if head != embed:
            raise CheckpointError(
                f"{directory}: tensor 'lm_head.weight' has shape {list(head)}, expected {list(embed)}"
            )
    biases = sorted(n for n in shapes if n.endswith("_proj.bias"))
    if biases:
        raise CheckpointError(f"{directory}: projection biases are not supported: {biases[:3]}")
    missing_tokenizer = [f for f in TOKENIZER_FILES if not (directory / f).is_file()]
    if missing_tokenizer:
        raise CheckpointError(f"{directory}: the tokenizer is missing ({', '.join(missing_tokenizer)})")
    return CheckpointInfo(
        model_type=str(raw.get("model_type", "llama")),
        num_hidden_layers=int(raw["num_hidden_layers"]),
        hidden_size=int(raw["hidden_size"]),
        vocab_size=int(raw["vocab_size"]),
        num_tensors=len(shapes),
        torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
    )


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}") from None
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: a JSON object is expected")
    archs = raw.get("architectures") or ["LlamaForCausalLM"]
    if raw.get("model_type", "llama") not in ("llama", "mistral") and "LlamaForCausalLM" not in archs:
        raise CheckpointError(
            f"{path}: unsupported architecture {archs!r} (model_type={raw.get('model_type')!r})"
        )
    window = raw.get("sliding_window")
    if (
        window
        and raw.get("use_sliding_window", True)
        and int(window) < int(raw.get("max_position_embeddings", 2048))
    ):
        raise CheckpointError(f"{path}: sliding-window attention is not supported")
    for key in ("num_attention_heads", "hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers"):
        if not isinstance(raw.get(key), int) or raw[key] < 1:
            raise CheckpointError(f"{path}: {key} must be a positive integer, got {raw.get(key)!r}")
    return raw


def _expected_shapes(raw: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor the engine takes, with the shape ``config.json`` implies (HF layout: [out, in])."""
    heads, h = int(raw["num_attention_heads"]), int(raw["hidden_size"])
    kv_heads = int(raw.get("num_key_value_heads", heads))
    hd = int(raw.get("head_dim") or h // heads)
    inter, vocab = int(raw["intermediate_size"]), int(raw["vocab_size"])
    q_dim, kv_dim = heads * hd, kv_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
    }
    for i in range(int(raw["num_hidden_layers"])):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (q_dim, h),
                p + "self_attn.k_proj.weight": (kv_dim, h),
                p + "self_attn.v_proj.weight": (kv_dim, h),
                p + "self_attn.o_proj.weight": (h, q_dim),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
            }
        )
    return shapes


def _tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor, from the headers of the single file or of every shard."""
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index}: no readable weight_map ({exc})") from None
        shapes: dict[str, tuple[int, ...]] = {}
        for shard in sorted(set(weight_map.values())):
            shapes.update(_header_shapes(directory / shard))
        return shapes
    if (directory / SINGLE_FILE).is_file():
        return _header_shapes(directory / SINGLE_FILE)
    raise CheckpointError(f"{directory}: neither {INDEX_FILE} nor {SINGLE_FILE} found")


def _header_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """The tensors of one safetensors file from its header, each checked to fit the file."""
    if not file.is_file():
        raise CheckpointError(f"{file}: shard missing")
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{file}: too short to be a safetensors file")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{file}: header length {header_len} exceeds the file")
        try:
            header: dict[str, Any] = json.loads(f.read(header_len))
        except ValueError as exc:
            raise CheckpointError(f"{file}: unreadable header ({exc})") from None
    header.pop("__metadata__", None)
    data_len = size - 8 - header_len
    shapes: dict[str, tuple[int, ...]] = {}
    for name, info in header.items():
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        if dtype not in _SUPPORTED_DTYPES:
            raise CheckpointError(
                f"{file}: tensor {name!r} has unsupported dtype {dtype} (want F32/F16/BF16)"
            )
        count = 1
        for dim in shape:
            count *= int(dim)
        if not 0 <= begin <= end <= data_len or end - begin != count * _DTYPE_BYTES[dtype]:
            raise CheckpointError(
                f"{file}: tensor {name!r} offsets {[begin, end]} do not fit {dtype}{list(shape)}"
            )
        shapes[name] = shape
    return shapes
