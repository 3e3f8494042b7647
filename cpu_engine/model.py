"""The Llama forward pass in numpy over a flat batch of tokens and a paged KV cache.

Every linear layer sees all tokens of the step at once (decode tokens and prefill chunks alike); only
attention cares which sequence a token belongs to, and it reads keys and values through block tables.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cpu_engine.attention import paged_attention, write_kv
from cpu_engine.config import LinearDType, ModelConfig
from cpu_engine.linear import PackedLinear
from cpu_engine.native import elementwise_ext as _native
from cpu_engine.native import matmul_f32_ext as _matmul
from cpu_engine.rope import RotaryTable
from cpu_engine.weights import LlamaWeights

Linear = Callable[[np.ndarray], np.ndarray]


class DenseLinear:
    """float32 ``x @ W``: exact reference numerics, about a third of bf16's speed where bf16 is native.

    numpy's BLAS for one row (a gemv) and for many (prefill chunks); for a few rows (decode steps),
    ``matmul_f32``, which reads W once per call where the BLAS packs it anew: on a Zen 1 core 1.9-4.9x
    faster for 2-8 rows of the dev model's layers and 1.2-2.7x for its lm_head (``python -m
    bench.linear_bench --float32``). A wide weight (a row over ``NARROW_ROW_BYTES``, the lm_head) is also
    kept transposed, which the kernel reads row by row (see csrc/matmul_f32.c): one more copy of that
    weight in memory.
    """

    NATIVE_ROWS = range(2, 33)  # rows of x that go to matmul_f32: where it beat OpenBLAS, measured
    NARROW_ROW_BYTES = 8192  # a row of W within two 4 KiB pages: the kernel reads W as it is

    __slots__ = ("_transposed", "weight")

    def __init__(self, weight: np.ndarray) -> None:
        self.weight = np.ascontiguousarray(weight, dtype=np.float32)
        wide = weight.shape[1] * 4 > self.NARROW_ROW_BYTES
        self._transposed = np.ascontiguousarray(self.weight.T) if wide else None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.shape[0] not in self.NATIVE_ROWS or not x.flags.c_contiguous:
            return x @ self.weight
        out = np.empty((x.shape[0], self.weight.shape[1]), dtype=np.float32)
        if self._transposed is None:
            _matmul.matmul_f32(out, x, self.weight)
        else:
            _matmul.matmul_f32(out, x, self._transposed, True)
        return out


def make_linear(weight: np.ndarray, dtype: LinearDType) -> Linear:
    return DenseLinear(weight) if dtype == "float32" else PackedLinear(weight)


@dataclass(frozen=True)
class _Layer:
    input_norm: np.ndarray
    qkv: Linear
    o: Linear
    post_attn_norm: np.ndarray
    gate_up: Linear
    down: Linear


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, residual: np.ndarray | None = None) -> np.ndarray:
    """RMSNorm of each row of x (float32 [n, d], C-contiguous), natively: a new array. With ``residual``
    ([n, d]), ``x += residual`` first, in place: the residual stream's add fused with the norm that
    reads it. The numbers of ``rms_norm_reference`` to float32 rounding."""
    return _native.rms_norm(x, weight, eps, residual)


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """``silu(gate) * up`` for ``gate_up = [gate | up]`` (float32 [n, 2i], C-contiguous) -> [n, i],
    natively; the numbers of ``silu_mul_reference`` to float32 rounding."""
    return _native.silu_mul(gate_up)


def rms_norm_reference(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """The numpy reference of ``rms_norm`` (for tests)."""
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return (x / np.sqrt(variance + eps)) * weight


def silu_mul_reference(gate_up: np.ndarray, intermediate: int) -> np.ndarray:
    """The numpy reference of ``silu_mul`` (for tests)."""
    gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
    return gate / (1.0 + np.exp(-gate)) * up


class KVCache:
    """Per-layer key and value tensors, [num_blocks, block_size, num_kv_heads, head_dim]: float32 for
    dtype "float32", uint16 bfloat16 bits (half the bytes; see cpu_engine.attention) for "bfloat16"."""

    def __init__(
        self, cfg: ModelConfig, num_blocks: int, block_size_tokens: int, *, dtype: LinearDType
    ) -> None:
        shape = (num_blocks, block_size_tokens, cfg.num_key_value_heads, cfg.head_dim)
        element = np.uint16 if dtype == "bfloat16" else np.float32
        self.dtype = dtype
        self.keys = [np.zeros(shape, dtype=element) for _ in range(cfg.num_hidden_layers)]
        self.values = [np.zeros(shape, dtype=element) for _ in range(cfg.num_hidden_layers)]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        for src, dst in copies:
            for layer_k, layer_v in zip(self.keys, self.values, strict=True):
                layer_k[dst] = layer_k[src]
                layer_v[dst] = layer_v[src]

    @property
    def num_bytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))


class LlamaModel:
    def __init__(
        self, cfg: ModelConfig, weights: LlamaWeights, kv_cache: KVCache, dtype: LinearDType = "bfloat16"
    ) -> None:
        self.cfg = cfg
        self.kv = kv_cache
        self.embed = weights.embed
        self.final_norm = weights.final_norm
        self.lm_head = make_linear(weights.lm_head, dtype)
        self.layers = [
            _Layer(
                input_norm=lw.input_norm,
                qkv=make_linear(lw.wqkv, dtype),
                o=make_linear(lw.wo, dtype),
                post_attn_norm=lw.post_attn_norm,
                gate_up=make_linear(lw.w_gate_up, dtype),
                down=make_linear(lw.w_down, dtype),
            )
            for lw in weights.layers
        ]
        self.rope = RotaryTable(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.scale = float(cfg.head_dim) ** -0.5
        self.q_dim = cfg.num_attention_heads * cfg.head_dim
        self.kv_dim = cfg.num_key_value_heads * cfg.head_dim

    def forward(
        self,
        input_ids: np.ndarray,
        positions: np.ndarray,
        seq_index: np.ndarray,
        block_tables: np.ndarray,
        slot_mapping: np.ndarray,
        logits_indices: np.ndarray,
    ) -> np.ndarray:
        """Compute keys/values for every token into the cache; return logits for ``logits_indices`` only.

        input_ids, positions, seq_index, slot_mapping: [num_tokens]; block_tables: [num_seqs, max_blocks].
        Returns float32 [len(logits_indices), vocab].
        """
        cfg = self.cfg
        num_tokens = input_ids.shape[0]
        # NOTE: a copy (fancy indexing), so the residual stream can be added to in place.
        hidden = self.embed[input_ids]
        delta: np.ndarray | None = None  # what the last sublayer adds to hidden, added by the next norm
        for layer, k_cache, v_cache in zip(self.layers, self.kv.keys, self.kv.values, strict=True):
            x = rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps, residual=delta)
            qkv = layer.qkv(x)
            q = qkv[:, : self.q_dim].reshape(num_tokens, cfg.num_attention_heads, cfg.head_dim)
            k = qkv[:, self.q_dim : self.q_dim + self.kv_dim].reshape(
                num_tokens, cfg.num_key_value_heads, cfg.head_dim
            )
            v = qkv[:, self.q_dim + self.kv_dim :].reshape(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
            # q into a new array (attention wants it C-contiguous); k in place (write_kv takes strided rows).
            q = self.rope.apply(q, positions)
            self.rope.apply(k, positions, out=k)
            write_kv(k_cache, v_cache, k, v, slot_mapping)
            attn = paged_attention(q, k_cache, v_cache, block_tables, seq_index, positions, self.scale)
            delta = layer.o(attn.reshape(num_tokens, self.q_dim))
            x = rms_norm(hidden, layer.post_attn_norm, cfg.rms_norm_eps, residual=delta)
            delta = layer.down(silu_mul(layer.gate_up(x)))
        last_residual = None if delta is None else delta[logits_indices]
        last = rms_norm(hidden[logits_indices], self.final_norm, cfg.rms_norm_eps, residual=last_residual)
        return self.lm_head(last)
