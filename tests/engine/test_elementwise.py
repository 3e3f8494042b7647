"""The elementwise kernels (RMSNorm, SiLU-and-multiply, RoPE) against their numpy references, and their
argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_engine import _elementwise as native
from cpu_engine.model import rms_norm, rms_norm_reference, silu_mul, silu_mul_reference
from cpu_engine.rope import RotaryTable

ROWS = [1, 2, 3, 7, 32, 33, 100, 300]
CANARY = 64  # NaN floats on both sides of an out buffer: a write outside it shows


def guarded(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """An out array of this shape between NaN canaries, and the whole buffer."""
    buffer = np.full(int(np.prod(shape)) + 2 * CANARY, np.nan, dtype=np.float32)
    return buffer[CANARY:-CANARY].reshape(shape), buffer


def assert_canaries(buffer: np.ndarray) -> None:
    assert np.isnan(buffer[:CANARY]).all() and np.isnan(buffer[-CANARY:]).all(), "wrote outside out"


# ---- rms_norm ----


@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("d", [1, 3, 17, 255, 256, 257, 1001])
def test_rms_norm_matches_the_reference(n: int, d: int) -> None:
    rng = np.random.default_rng(n * 1000 + d)
    x = rng.standard_normal((n, d), dtype=np.float32) * np.float32(3.0)
    weight = rng.standard_normal(d, dtype=np.float32)
    expected = rms_norm_reference(x, weight, 1e-5)
    out, buffer = guarded((n, d))
    before = x.copy()
    assert native.rms_norm(x, weight, 1e-5, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=1e-6)
    assert_canaries(buffer)
    np.testing.assert_array_equal(x, before)  # no residual: x is only read


@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("d", [5, 256, 333])
def test_rms_norm_adds_the_residual_in_place_first(n: int, d: int) -> None:
    rng = np.random.default_rng(n + d)
    x = rng.standard_normal((n, d), dtype=np.float32)
    residual = rng.standard_normal((n, d), dtype=np.float32)
    weight = rng.standard_normal(d, dtype=np.float32)
    summed = x + residual
    out = rms_norm(x, weight, 1e-6, residual=residual)
    np.testing.assert_array_equal(x, summed)  # the same float32 add as numpy's, bit for bit
    np.testing.assert_allclose(out, rms_norm_reference(summed, weight, 1e-6), rtol=2e-5, atol=1e-6)


def test_rms_norm_in_place_and_edge_values() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((9, 64), dtype=np.float32)
    x[3] = 0.0  # all zeros: eps keeps it finite (0)
    x[4] *= np.float32(1e-20)  # tiny rows: the mean of squares is subnormal or zero in float32
    weight = rng.standard_normal(64, dtype=np.float32)
    expected = rms_norm_reference(x, weight, 1e-5)
    assert native.rms_norm(x, weight, 1e-5, out=x) is x
    np.testing.assert_allclose(x, expected, rtol=2e-5, atol=1e-6)
    assert not x[3].any()
    empty = rms_norm(np.zeros((0, 64), np.float32), weight, 1e-5)
    assert empty.shape == (0, 64) and empty.dtype == np.float32


def test_rms_norm_refuses_bad_arguments() -> None:
    x = np.ones((4, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(TypeError, match="x must have dtype float32"):
        native.rms_norm(x.astype(np.float64), w, 1e-5)
    with pytest.raises(TypeError, match=r"numpy\.ndarray"):
        native.rms_norm([[1.0]], w, 1e-5)
    with pytest.raises(ValueError, match="x must have 2 dimensions"):
        native.rms_norm(x[0], w, 1e-5)
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        native.rms_norm(np.ones((8, 4), np.float32).T, w, 1e-5)
    with pytest.raises(ValueError, match=r"weight must have shape \[d\] = \[8\]"):
        native.rms_norm(x, np.ones(7, np.float32), 1e-5)
    with pytest.raises(ValueError, match="eps must be"):
        native.rms_norm(x, w, -1.0)
    with pytest.raises(ValueError, match="residual must have the shape of x"):
        native.rms_norm(x, w, 1e-5, residual=np.ones((4, 7), np.float32))
    with pytest.raises(ValueError, match="residual must not overlap x"):
        native.rms_norm(x, w, 1e-5, residual=x)
    readonly = x.copy()
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match=r"x \(residual is added to it in place\) must be writeable"):
        native.rms_norm(readonly, w, 1e-5, residual=np.ones((4, 8), np.float32))
    with pytest.raises(ValueError, match="out must be writeable"):
        native.rms_norm(x, w, 1e-5, out=readonly)
    with pytest.raises(ValueError, match=r"out must have shape \(4, 8\), got \(4, 9\)"):
        native.rms_norm(x, w, 1e-5, out=np.empty((4, 9), np.float32))
    overlapping = np.ones((5, 8), np.float32)
    with pytest.raises(ValueError, match="out must be x itself or not overlap"):
        native.rms_norm(overlapping[:4], w, 1e-5, out=overlapping[1:])


# ---- silu_mul ----


@pytest.mark.parametrize("n", ROWS)
@pytest.mark.parametrize("intermediate", [1, 3, 17, 343, 688])
def test_silu_mul_matches_the_reference(n: int, intermediate: int) -> None:
    rng = np.random.default_rng(n * 1000 + intermediate)
    gate_up = rng.standard_normal((n, 2 * intermediate), dtype=np.float32) * np.float32(4.0)
    gate_up[0, 0] = -80.0  # exp(80) is near float32's top: silu is a tiny negative number
    gate_up[-1, intermediate - 1] = 80.0  # silu(x) = x
    expected = silu_mul_reference(gate_up, intermediate)
    out, buffer = guarded((n, intermediate))
    assert native.silu_mul(gate_up, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert_canaries(buffer)
    np.testing.assert_allclose(silu_mul(gate_up), expected, rtol=1e-5, atol=1e-6)


def test_silu_mul_refuses_bad_arguments() -> None:
    gate_up = np.ones((3, 8), np.float32)
    with pytest.raises(ValueError, match="even number"):
        native.silu_mul(np.ones((3, 7), np.float32))
    with pytest.raises(ValueError, match="even number"):
        native.silu_mul(np.ones((3, 0), np.float32))
    with pytest.raises(TypeError, match="gate_up must have dtype float32"):
        native.silu_mul(gate_up.astype(np.float16))
    with pytest.raises(ValueError, match="gate_up must be C-contiguous"):
        native.silu_mul(np.ones((6, 8), np.float32)[::2])
    with pytest.raises(ValueError, match=r"out must have shape \(3, 4\)"):
        native.silu_mul(gate_up, out=np.empty((3, 8), np.float32))
    with pytest.raises(ValueError, match="out must not overlap gate_up"):
        native.silu_mul(gate_up, out=gate_up.reshape(6, 4)[:3])


# ---- rope ----


def rope_inputs(
    num_tokens: int, num_heads: int, head_dim: int, seed: int
) -> tuple[RotaryTable, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    table = RotaryTable(head_dim, 4096, 10000.0, None)
    x = rng.standard_normal((num_tokens, num_heads, head_dim), dtype=np.float32)
    positions = rng.integers(0, 4096, num_tokens, dtype=np.int32)
    return table, x, positions


@pytest.mark.parametrize("num_tokens", ROWS)
@pytest.mark.parametrize(("num_heads", "head_dim"), [(1, 2), (4, 64), (2, 64), (3, 6), (5, 130), (32, 128)])
def test_rope_matches_the_reference(num_tokens: int, num_heads: int, head_dim: int) -> None:
    table, x, positions = rope_inputs(num_tokens, num_heads, head_dim, num_tokens * 100 + head_dim)
    expected = table.apply_reference(x, *table.gather(positions))
    out, buffer = guarded(x.shape)
    assert table.apply(x, positions, out=out) is out
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert_canaries(buffer)
    fresh = table.apply(x, positions)
    assert fresh.flags.c_contiguous
    np.testing.assert_array_equal(fresh, out)


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 4.0}])
def test_rope_in_place_on_a_column_slice_of_qkv(scaling: dict[str, object] | None) -> None:
    """As the model uses it: k rotated where it lies in the fused qkv output, q and v untouched."""
    rng = np.random.default_rng(7)
    num_tokens, q_dim, kv_dim, head_dim = 37, 256, 128, 64
    table = RotaryTable(head_dim, 2048, 500000.0, scaling)
    qkv = rng.standard_normal((num_tokens, q_dim + 2 * kv_dim), dtype=np.float32)
    k = qkv[:, q_dim : q_dim + kv_dim].reshape(num_tokens, kv_dim // head_dim, head_dim)
    positions = np.arange(100, 100 + num_tokens, dtype=np.int32)
    expected_k = table.apply_reference(k, *table.gather(positions))
    q_and_v = np.concatenate([qkv[:, :q_dim], qkv[:, q_dim + kv_dim :]], axis=1)
    rotated = k.view()  # another view of the same elements counts as in place too
    assert table.apply(k, positions, out=rotated) is rotated
    np.testing.assert_allclose(k, expected_k, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(qkv[:, :q_dim], q_and_v[:, :q_dim])
    np.testing.assert_array_equal(qkv[:, q_dim + kv_dim :], q_and_v[:, q_dim:])


def test_rope_refuses_bad_arguments() -> None:
    table, x, positions = rope_inputs(4, 2, 8, 0)
    with pytest.raises(ValueError, match=r"must lie in \[0, 4096\), got 4096 at index 2"):
        table.apply(x, np.array([0, 1, 4096, 3], np.int32))
    with pytest.raises(ValueError, match=r"must lie in \[0, 4096\), got -1 at index 0"):
        table.apply(x, np.array([-1, 1, 2, 3], np.int32))
    with pytest.raises(TypeError, match="positions must have dtype int32"):
        table.apply(x, positions.astype(np.int64))
    with pytest.raises(ValueError, match="positions must have num_tokens = 4 entries, got 3"):
        table.apply(x, positions[:3])
    with pytest.raises(ValueError, match=r"head_dim \(6\) must be twice the tables' columns \(4\)"):
        table.apply(np.ones((4, 2, 6), np.float32), positions)
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        table.apply(x.reshape(4, 16), positions)
    with pytest.raises(ValueError, match="x must have each row"):
        table.apply(np.ones((4, 8, 2), np.float32).transpose(0, 2, 1), positions)
    with pytest.raises(ValueError, match="cos and sin must have the same shape"):
        native.rope(x, positions, table.cos, np.ascontiguousarray(table.sin[:, :2]))
    with pytest.raises(ValueError, match=r"out must have shape \(4, 2, 8\)"):
        table.apply(x, positions, out=np.empty((4, 1, 8), np.float32))
    overlapping = np.ones((5, 2, 8), np.float32)
    with pytest.raises(ValueError, match="out must be x itself or not overlap"):
        table.apply(overlapping[:4], positions, out=overlapping[1:])
    # Rows at a stride: out starts past x's own bytes (4 rows of 8 floats) but inside its span, on x's row 3.
    strided = np.ones((7, 3, 8), np.float32)[:, :2]
    with pytest.raises(ValueError, match="out must be x itself or not overlap"):
        table.apply(strided[:4], positions, out=strided[3:7])
