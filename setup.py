"""Builds the CPU engine's one native kernel (paged attention); everything else is in pyproject.toml."""

import numpy as np
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cpu_engine._paged_attention",
            sources=["cpu_engine/csrc/paged_attention.c"],
            include_dirs=[np.get_include()],
            # -march=native: the kernel is built on the machine that runs it (make installs it locally).
            extra_compile_args=["-O3", "-march=native", "-fopenmp", "-ffast-math", "-std=c11"],
            extra_link_args=["-fopenmp"],
        )
    ]
)
