"""Type stub of the native kernel built from csrc/linear_bf16.c (see cpu_engine.linear)."""

import numpy as np

simd: str
tiles: str
TILE_N: int
openmp_wake_us: float

def pack_bf16(w: np.ndarray, /) -> np.ndarray: ...
def linear_bf16(
    out: np.ndarray,
    x: np.ndarray,
    packed: np.ndarray,
    K: int,
    N: int,
    accumulate: bool = False,
    num_threads: int = 0,
) -> None: ...

# The same signature: the vector kernel without AMX tiles, and the portable C code alone (for tests).
linear_bf16_vector = linear_bf16
linear_bf16_portable = linear_bf16
