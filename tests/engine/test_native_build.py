"""The native kernels must not change the process's floating-point environment (flush-to-zero)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_kernels_keeps_subnormals() -> None:
    code = (
        "import numpy as np, cpu_engine.attention, cpu_engine.linear, cpu_engine.model;"
        "assert np.nextafter(np.float32(0), np.float32(1)) * np.float32(4) > 0, 'FTZ/DAZ set by a kernel'"
    )
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
