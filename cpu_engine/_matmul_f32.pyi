"""Type stub of the native kernel built from csrc/matmul_f32.c (see cpu_engine.model.DenseLinear)."""

import numpy as np

def matmul_f32(out: np.ndarray, x: np.ndarray, w: np.ndarray, transposed: bool = False, /) -> None: ...
