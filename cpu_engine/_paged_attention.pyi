"""Type stub of the native kernel built from csrc/paged_attention.c (see cpu_engine.attention)."""

import numpy as np

simd: str

def paged_attention(
    out: np.ndarray,
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_index: np.ndarray,
    positions: np.ndarray,
    scale: float,
    /,
) -> None: ...
def paged_attention_portable(
    out: np.ndarray,
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_index: np.ndarray,
    positions: np.ndarray,
    scale: float,
    /,
) -> None: ...
def write_kv_bf16(cache: np.ndarray, x: np.ndarray, slot_mapping: np.ndarray, /) -> None: ...
