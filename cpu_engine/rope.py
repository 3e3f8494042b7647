"""Rotary position embeddings (the Hugging Face "rotate half" layout) with Llama 3 and linear scaling."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cpu_engine.native import elementwise_ext as _native


def inverse_frequencies(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> np.ndarray:
    """Per-pair rotation frequencies, float32, computed as transformers does so greedy outputs agree."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
    inv_freq = inv_freq.astype(np.float32)
    if scaling is None:
        return inv_freq
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "linear":
        return (inv_freq / float(scaling["factor"])).astype(np.float32)
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling)
    raise ValueError(f"unsupported rope scaling {rope_type!r} (supported: default, linear, llama3)")


def _llama3(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling.get("low_freq_factor", 1.0))
    high_freq_factor = float(scaling.get("high_freq_factor", 4.0))
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


class RotaryTable:
    """Precomputed cos/sin for every position up to the model's context length."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None):
        inv_freq = inverse_frequencies(head_dim, theta, scaling)
        freqs = np.outer(np.arange(max_positions, dtype=np.float32), inv_freq).astype(np.float32)
        self.cos = np.cos(freqs).astype(np.float32)  # [max_positions, head_dim // 2]
        self.sin = np.sin(freqs).astype(np.float32)
        self.half = head_dim // 2

    def apply(self, x: np.ndarray, positions: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rotate ``x`` ([num_tokens, num_heads, head_dim], float32, each token's row contiguous) by the
        angles of ``positions`` (int32 [num_tokens]), natively; the same numbers as ``apply_reference``.

        Written into ``out`` (like x; default: a new C-contiguous array), which may be ``x`` itself.
        Returns ``out``. A wrong dtype raises TypeError; a wrong shape or layout, or a position outside
        the table, ValueError.
        """
        return _native.rope(x, positions, self.cos, self.sin, out)

    def gather(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin for these positions, shaped to broadcast over heads: [num_tokens, 1, head_dim // 2]."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    def apply_reference(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """The numpy reference of ``apply`` (for tests): rotate ``x`` by the angles from ``gather``."""
        x1, x2 = x[..., : self.half], x[..., self.half :]
        out = np.empty_like(x)
        out[..., : self.half] = x1 * cos - x2 * sin
        out[..., self.half :] = x2 * cos + x1 * sin
        return out
