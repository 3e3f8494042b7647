"""Builds the CPU engine's native kernels (paged attention, bf16 linear, float32 few-row matmul,
elementwise); the rest is in pyproject.toml."""

import numpy as np
from setuptools import Extension, setup

# -march=native: the kernels are built on the machine that runs them (make installs them locally).
COMPILE_ARGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-std=c11"]

setup(
    ext_modules=[
        Extension(
            "cpu_engine._paged_attention",
            sources=["cpu_engine/csrc/paged_attention.c"],
            depends=["cpu_engine/csrc/npy_args.h", "cpu_engine/csrc/vec8.h"],
            include_dirs=[np.get_include()],
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=["-fopenmp"],
        ),
        Extension(
            "cpu_engine._linear",
            sources=["cpu_engine/csrc/linear_bf16.c"],
            depends=["cpu_engine/csrc/npy_args.h"],
            include_dirs=[np.get_include()],
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=["-fopenmp"],
        ),
        Extension(
            "cpu_engine._matmul_f32",
            sources=["cpu_engine/csrc/matmul_f32.c"],
            depends=["cpu_engine/csrc/npy_args.h", "cpu_engine/csrc/vec8.h"],
            include_dirs=[np.get_include()],
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=["-fopenmp"],
        ),
        Extension(
            "cpu_engine._elementwise",
            sources=["cpu_engine/csrc/elementwise.c"],
            depends=["cpu_engine/csrc/npy_args.h"],
            include_dirs=[np.get_include()],
            extra_compile_args=COMPILE_ARGS,
            # NOTE: libm explicitly: the vectorised expf (libmvec) is not in the Python binary's libm.
            libraries=["m"],
            extra_link_args=["-fopenmp"],
        ),
    ]
)
