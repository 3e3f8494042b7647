"""The float32 few-row matmul (csrc/matmul_f32.c) and DenseLinear's routing to it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpu_engine.model import DenseLinear
from cpu_engine.native import matmul_f32_ext as native

# Sums in another order than the BLAS: float32 rounding apart, relative to the size of the terms.
RTOL, ATOL = 1e-5, 1e-4


def _operands(m: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 130),
    n=st.integers(1, 90),
    transposed=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_shape_matches_numpy(m: int, k: int, n: int, transposed: bool, seed: int) -> None:
    # Shapes off every block size: the row groups (4), column blocks (16, 4) and K steps (8) all have tails.
    x, w = _operands(m, k, n, seed)
    out = np.full((m, n), np.nan, dtype=np.float32)
    native.matmul_f32(out, x, np.ascontiguousarray(w.T) if transposed else w, transposed)
    np.testing.assert_allclose(out, x @ w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 32, 64])
def test_model_shapes_match_numpy(m: int, transposed: bool) -> None:
    # The dev model's lm_head and MLP shapes, past the size where OpenMP threads share the columns.
    for k, n in ((256, 8192), (256, 1376), (688, 256)):
        x, w = _operands(m, k, n, m * k)
        out = np.empty((m, n), dtype=np.float32)
        native.matmul_f32(out, x, np.ascontiguousarray(w.T) if transposed else w, transposed)
        np.testing.assert_allclose(out, x @ w, rtol=RTOL, atol=ATOL)


def _bad(**changes: object) -> dict[str, object]:
    x, w = _operands(3, 8, 16, 0)
    args: dict[str, object] = {"out": np.empty((3, 16), dtype=np.float32), "x": x, "w": w}
    args.update(changes)
    return args


BAD = {
    "x float64": (_bad(x=np.zeros((3, 8))), TypeError, "x must have dtype float32"),
    "w a list": (_bad(w=[[0.0] * 16] * 8), TypeError, "w must be a numpy.ndarray"),
    "x 1-D": (_bad(x=np.zeros(8, dtype=np.float32)), ValueError, "x must have 2 dimensions"),
    "K differs": (_bad(w=np.zeros((9, 16), dtype=np.float32)), ValueError, "shapes do not chain"),
    "out too small": (_bad(out=np.empty((3, 15), dtype=np.float32)), ValueError, "shapes do not chain"),
    "x strided": (_bad(x=np.zeros((3, 16), dtype=np.float32)[:, ::2]), ValueError, "C-contiguous"),
}
_SQUARE = np.zeros((4, 4), dtype=np.float32)
BAD["out is x"] = (
    {"out": _SQUARE, "x": _SQUARE, "w": np.eye(4, dtype=np.float32)},
    ValueError,
    "must not overlap",
)


@pytest.mark.parametrize("case", list(BAD.values()), ids=list(BAD))
def test_bad_arguments_raise_clearly(case: tuple[dict[str, object], type[Exception], str]) -> None:
    args, error, message = case
    with pytest.raises(error, match=message):
        native.matmul_f32(args["out"], args["x"], args["w"])


@pytest.mark.parametrize("n", [256, 8192])  # a narrow weight, read as it is; a wide one, kept transposed
@pytest.mark.parametrize("m", [1, 2, 7, 32, 33, 100])  # numpy, the kernel, numpy again past its rows
def test_dense_linear_is_x_at_w_for_any_rows(m: int, n: int) -> None:
    x, w = _operands(m, 256, n, m + n)
    layer = DenseLinear(w)
    assert (layer._transposed is not None) == (n * 4 > DenseLinear.NARROW_ROW_BYTES)
    np.testing.assert_allclose(layer(x), x @ w, rtol=RTOL, atol=ATOL)
    # A strided x (a column slice) is fine too: it goes to numpy.
    wide_x = np.concatenate([x, x], axis=1)[:, :256]
    np.testing.assert_allclose(layer(wide_x), x @ w, rtol=RTOL, atol=ATOL)
