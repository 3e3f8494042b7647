"""Type stub of the native kernels built from csrc/elementwise.c (see cpu_engine.model, cpu_engine.rope)."""

import numpy as np

def rms_norm(
    x: np.ndarray,
    weight: np.ndarray,
    eps: float,
    residual: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray: ...
def silu_mul(gate_up: np.ndarray, out: np.ndarray | None = None) -> np.ndarray: ...
def rope(
    x: np.ndarray,
    positions: np.ndarray,
    cos: np.ndarray,
    sin: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray: ...
def set_num_threads(n: int, /) -> None: ...
def get_max_threads() -> int: ...
