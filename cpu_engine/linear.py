"""Linear layers in bfloat16: ``x @ W`` with both operands rounded to bf16 and float32 accumulation.

A weight is rounded and packed once (``PackedLinear(w)``, w float32 [K, N] = [in, out]); each call rounds
x [M, K] to bf16 and returns float32 [M, N]. The rounding is to nearest, ties to even. On CPUs with
AVX-512 BF16 (vdpbf16ps) the kernel runs at about twice the float32 matmul's speed and reads half the
weight bytes; with AMX-BF16 it multiplies in tiles, 5-10x faster again from 16 rows (``KERNEL_TILES``);
elsewhere a portable C path computes the same thing slowly (see ``KERNEL_SIMD``).

Precision: bf16 keeps 8 significant bits, so each product carries a relative error of up to about 2^-8
from rounding its operands, which mostly averages out over K; the accumulation is float32 and adds little.
"""

from __future__ import annotations

import numpy as np

from cpu_engine.native import linear_ext as _native

# Which code the kernel was compiled to: "avx512_bf16" or "portable".
KERNEL_SIMD: str = _native.simd
# "amx_bf16" where it multiplies with AMX tiles (compiled for them, and this process may use them), else "".
KERNEL_TILES: str = _native.tiles


class PackedLinear:
    """A float32 [K, N] weight rounded to bf16 and packed for the kernel; ``layer(x)`` is ``x @ W``.

    The packed copy takes K * N * 2 bytes (N rounded up to a multiple of 64, K to a multiple of 2); the
    float32 weight is not kept.
    """

    __slots__ = ("in_features", "out_features", "packed")

    def __init__(self, weight: np.ndarray) -> None:
        if not isinstance(weight, np.ndarray) or weight.dtype != np.float32:
            raise TypeError(f"weight must be a float32 numpy.ndarray, got {_describe(weight)}")
        if weight.ndim != 2 or weight.shape[0] < 1 or weight.shape[1] < 1:
            raise ValueError(f"weight must be [K, N] = [in, out] with K, N >= 1, got shape {weight.shape}")
        self.in_features, self.out_features = weight.shape
        self.packed = _native.pack_bf16(np.ascontiguousarray(weight))

    def __call__(self, x: np.ndarray, out: np.ndarray | None = None, accumulate: bool = False) -> np.ndarray:
        """``bf16(x) @ W`` for x float32 [M, K], C-contiguous (nothing is converted or copied).

        Written into ``out`` (float32 [M, N], C-contiguous, not overlapping x; default: a new array), or
        added to it when ``accumulate`` (``out += x @ W``, e.g. a residual stream). Returns ``out``.
        Wrong arguments raise TypeError (type, dtype) or ValueError (shape, layout, overlap).
        """
        if out is None:
            if accumulate:
                raise ValueError("accumulate=True needs out (the array to add to)")
            if not isinstance(x, np.ndarray) or x.ndim != 2:
                raise TypeError(f"x must be a 2-D float32 numpy.ndarray [M, K], got {_describe(x)}")
            out = np.empty((x.shape[0], self.out_features), dtype=np.float32)
        _native.linear_bf16(out, x, self.packed, self.in_features, self.out_features, accumulate)
        return out

    def __repr__(self) -> str:
        return f"PackedLinear(in_features={self.in_features}, out_features={self.out_features}, bf16)"


def bf16_round(a: np.ndarray) -> np.ndarray:
    """The float32 values nearest to ``a`` that bf16 can hold (ties to even; NaN stays NaN): the numbers
    the kernel actually multiplies. For references and precision checks, not for speed."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = np.where(nan, bits | np.uint32(0x00400000), rounded)
    return rounded.view(np.float32)


def _describe(obj: object) -> str:
    if isinstance(obj, np.ndarray):
        return f"{obj.dtype} array of shape {obj.shape}"
    return type(obj).__name__
