"""The engine's native kernels, loaded in one place so their shared OpenMP runtime is set up once.

NOTE: the attention, linear and matmul kernels use one libgomp (the elementwise kernels are single-threaded),
which reads OMP_WAIT_POLICY once, when the first of them loads it. Its default lets idle threads spin
after each call, which steals a core from whatever runs next (numpy, the Triton stub's sender thread,
the gateway on the same two cores); passive threads sleep instead, at 10-20 us per call to wake them
(the linear kernel weighs that when sizing its team). An explicit setting in the environment wins. This
has no effect if another module loaded libgomp first (torch ships its own copy under the same name).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _load(module: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(f"cpu_engine.{module}")
    except ImportError as exc:  # pragma: no cover - depends on the build
        raise ImportError(
            f"{what} cpu_engine.{module} is not built; "
            "run `pip install -e .` (or `python setup.py build_ext --inplace`) in the repository root"
        ) from exc


paged_attention_ext = _load("_paged_attention", "the paged attention kernel")
linear_ext = _load("_linear", "the bf16 linear kernel")
matmul_f32_ext = _load("_matmul_f32", "the float32 few-row matmul kernel")
elementwise_ext = _load("_elementwise", "the elementwise kernels (RMSNorm, SiLU, RoPE)")
