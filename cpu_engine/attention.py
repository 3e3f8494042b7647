"""Attention over the paged KV cache: the native kernel, its plain-numpy reference, and the KV write.

Layouts (all float32 unless said):
    q, out:            [num_tokens, num_heads, head_dim]
    k_cache, v_cache:  [num_blocks, block_size, num_kv_heads, head_dim], both float32 or both uint16
                       holding bfloat16 bits (half the bytes; the kernel widens them to float32 on load)
    block_tables:      int32 [num_seqs, max_blocks_per_seq]
    seq_index:         int32 [num_tokens], the block_tables row of each token
    positions:         int32 [num_tokens], token t attends to positions 0..positions[t] of its sequence
Position p of a sequence lives in block ``block_tables[s, p // block_size]`` at offset ``p % block_size``.
Query head h reads kv head ``h // (num_heads // num_kv_heads)`` (grouped-query attention).
"""

from __future__ import annotations

import numpy as np

from cpu_engine.native import paged_attention_ext as _native

# Which code the kernel was compiled to: "avx512" or "portable".
KERNEL_SIMD: str = _native.simd


def paged_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_index: np.ndarray,
    positions: np.ndarray,
    scale: float,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Causal softmax(q·kᵀ·scale)·v of every token over its own sequence's cached keys and values.

    Every token's own key and value must already be in the cache (see ``write_kv``). Arrays must have
    exactly the dtypes of the module docstring and be C-contiguous: nothing is converted or copied, and
    a wrong argument raises TypeError (type, dtype) or ValueError (shape, layout, out-of-range id or
    position). ``out`` (default: a new array) may be ``q`` itself. Returns ``out``.
    """
    if out is None:
        out = np.empty_like(q)
    _native.paged_attention(out, q, k_cache, v_cache, block_tables, seq_index, positions, float(scale))
    return out


def reference_paged_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_index: np.ndarray,
    positions: np.ndarray,
    scale: float,
) -> np.ndarray:
    """The test oracle: the same contract as ``paged_attention``, one token and head at a time, in float64
    (a bf16 cache is widened exactly first)."""
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = np.empty((num_tokens, num_heads, head_dim), dtype=np.float32)
    for t in range(num_tokens):
        context = np.arange(int(positions[t]) + 1)
        blocks = block_tables[seq_index[t], context // block_size]
        keys = _as_float(k_cache[blocks, context % block_size]).astype(np.float64)  # [context, kv heads, d]
        values = _as_float(v_cache[blocks, context % block_size]).astype(np.float64)
        for h in range(num_heads):
            scores = keys[:, h // group] @ q[t, h].astype(np.float64) * scale
            weights = np.exp(scores - scores.max())
            out[t, h] = weights @ values[:, h // group] / weights.sum()
    return out


def write_kv(
    k_cache: np.ndarray, v_cache: np.ndarray, k: np.ndarray, v: np.ndarray, slot_mapping: np.ndarray
) -> None:
    """Store token i's key and value ([num_tokens, num_kv_heads, head_dim]) at flat slot ``slot_mapping[i]``.

    A slot is ``block_id * block_size + offset``. Into uint16 (bf16) caches, k and v are rounded to the
    nearest bf16 (ties to even), as ``cpu_engine.linear.bf16_round`` does. Raises ValueError on a shape
    mismatch or a slot outside the cache (numpy would wrap a negative slot around silently).
    """
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    num_slots = num_blocks * block_size
    expected = (slot_mapping.shape[0], num_kv_heads, head_dim)
    if slot_mapping.ndim != 1 or k.shape != expected or v.shape != expected:
        raise ValueError(
            f"write_kv: want k and v of shape {expected} for {slot_mapping.shape[0]} slots, "
            f"got k {k.shape}, v {v.shape}, slot_mapping {slot_mapping.shape}"
        )
    if v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            f"write_kv: k_cache ({k_cache.dtype} {k_cache.shape}) and v_cache ({v_cache.dtype} "
            f"{v_cache.shape}) differ"
        )
    if slot_mapping.size and (slot_mapping.min() < 0 or slot_mapping.max() >= num_slots):
        raise ValueError(
            f"write_kv: slots must lie in [0, {num_slots}), got {slot_mapping.min()}..{slot_mapping.max()}"
        )
    if k_cache.dtype == np.uint16:
        slots = np.asarray(slot_mapping, dtype=np.int64)
        _native.write_kv_bf16(_c_contiguous(k_cache), _rows_contiguous(k), slots)
        _native.write_kv_bf16(_c_contiguous(v_cache), _rows_contiguous(v), slots)
        return
    _flat_slots(k_cache)[slot_mapping] = k
    _flat_slots(v_cache)[slot_mapping] = v


def to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits of the value nearest to each element of ``a`` (ties to even; NaN stays NaN):
    the upper half of ``cpu_engine.linear.bf16_round(a)``'s bits, and what write_kv stores into a bf16
    cache (natively: this numpy form is ~10x slower on a decode step's few thousand values)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    # NOTE: adding 0x7FFF plus the lowest kept bit carries into the kept half exactly when round-to-nearest-
    # even rounds up; a NaN's carry could reach the exponent, so NaNs keep a quiet bit instead.
    rounded = (bits >> np.uint32(16)) & np.uint32(1)
    rounded += bits
    rounded += np.uint32(0x7FFF)
    rounded >>= np.uint32(16)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if nan.any():
        rounded[nan] = (bits[nan] >> np.uint32(16)) | np.uint32(0x0040)
    return rounded.astype(np.uint16)


def _rows_contiguous(x: np.ndarray) -> np.ndarray:
    """float32 x whose tokens' rows are each contiguous (what write_kv_bf16 needs), copying only if not."""
    x = np.asarray(x, dtype=np.float32)
    if x.strides[1:] == (x.shape[2] * 4, 4) or x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x)


def _as_float(a: np.ndarray) -> np.ndarray:
    """float32 values of a cache slice: bf16 bits (uint16) widened exactly, float32 as it is."""
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a


def _c_contiguous(cache: np.ndarray) -> np.ndarray:
    if not cache.flags.c_contiguous:
        raise ValueError("write_kv: the KV cache must be C-contiguous")
    return cache


def _flat_slots(cache: np.ndarray) -> np.ndarray:
    """A [num_slots, num_kv_heads, head_dim] view of a cache; raises rather than copy."""
    num_blocks, block_size, num_kv_heads, head_dim = _c_contiguous(cache).shape
    return cache.reshape(num_blocks * block_size, num_kv_heads, head_dim)
