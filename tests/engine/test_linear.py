"""The bf16 linear kernel against bf16-rounded float64 products, its packed layout, its argument checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpu_engine import _linear as native
from cpu_engine.linear import KERNEL_SIMD, KERNEL_TILES, PackedLinear, bf16_round

TILE_N = native.TILE_N
LinearFn = Callable[..., None]
# "native": the best this host has (AMX tiles where KERNEL_TILES says so); "vector": never AMX.
IMPLEMENTATIONS: dict[str, LinearFn] = {
    "native": native.linear_bf16,
    "vector": native.linear_bf16_vector,
    "portable": native.linear_bf16_portable,
}


def reference(x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """bf16(x) @ bf16(w) in float64, and a bound on a float32 accumulation's error for each entry:
    K * 2^-23 * (|x| @ |w|) (twice the worst case of summing K terms one by one in float32)."""
    xb, wb = bf16_round(x).astype(np.float64), bf16_round(w).astype(np.float64)
    bound = x.shape[1] * 2.0**-23 * (np.abs(xb) @ np.abs(wb))
    return xb @ wb, bound


def operands(m: int, k: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)


def check(impl: LinearFn, m: int, k: int, n: int, seed: int = 0, num_threads: int = 0) -> None:
    x, w = operands(m, k, n, seed)
    guarded = np.full(m * n + 2 * 64, np.nan, dtype=np.float32)  # NaN canaries on both sides of out
    out = guarded[64:-64].reshape(m, n)
    impl(out, x, native.pack_bf16(w), k, n, num_threads=num_threads)
    expected, bound = reference(x, w)
    assert np.all(np.abs(out - expected) <= bound), (
        f"M={m} K={k} N={n}: max error {np.abs(out - expected).max()}"
    )
    assert np.isnan(guarded[:64]).all() and np.isnan(guarded[-64:]).all(), "wrote outside out"


SHAPES = [
    (1, 1, 1),
    (1, 256, 512),
    (2, 3, 5),
    (7, 33, 65),
    (3, 40, 127),  # the last vector of the last tile has 15 of 16 columns
    (11, 70, 79),
    (6, 64, 64),
    (13, 257, 130),
    (32, 256, 256),
    (37, 688, 256),
    (64, 256, 1376),
    (5, 1001, 200),  # K > 2 blocks of 256 pairs, odd
    (160, 256, 8192),
    (517, 99, 131),
]


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS)
@pytest.mark.parametrize(("m", "k", "n"), SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_matches_bf16_reference(impl: LinearFn, m: int, k: int, n: int) -> None:
    check(impl, m, k, n)


@pytest.mark.parametrize("num_threads", [1, 2, 3, 5])
@pytest.mark.parametrize(
    ("m", "k", "n"), [(1, 64, 64), (40, 130, 70), (200, 512, 1376), (9, 300, 8192), (30, 20, 143)]
)
def test_any_team_size_gives_the_same_result(m: int, k: int, n: int, num_threads: int) -> None:
    check(native.linear_bf16, m, k, n, num_threads=num_threads)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS)
def test_a_row_does_not_depend_on_its_batch(impl: LinearFn) -> None:
    # Bitwise: each row is summed in the same order whatever the batch size, its place in the batch and
    # the team size (so recomputing a sequence, e.g. after preemption, reproduces its logits exactly).
    x, w = operands(37, 700, 300, seed=8)
    packed = native.pack_bf16(w)
    batch = np.empty((37, 300), np.float32)
    impl(batch, x, packed, 700, 300)
    for rows, num_threads in [(slice(0, 1), 1), (slice(5, 6), 2), (slice(3, 17), 3), (slice(36, 37), 0)]:
        alone = np.empty((rows.stop - rows.start, 300), np.float32)
        impl(alone, np.ascontiguousarray(x[rows]), packed, 700, 300, num_threads=num_threads)
        np.testing.assert_array_equal(alone, batch[rows])


@pytest.mark.skipif(not KERNEL_TILES, reason="this host's kernel does not multiply with AMX tiles")
@pytest.mark.parametrize(("m", "k", "n"), [(16, 32, 16), (17, 688, 256), (48, 256, 688), (3, 1000, 130)])
def test_amx_tiles_agree_with_the_vector_kernel_within_float32_rounding(m: int, k: int, n: int) -> None:
    # Blocks of 16 rows, the K pairs past the last 16 (688 / 2 = 344 = 21 x 16 + 8), a last block of
    # fewer rows, columns past N in the last tile; both sum every K pair in float32, in another order.
    x, w = operands(m, k, n, seed=3)
    packed = native.pack_bf16(w)
    tiles, vector = np.empty((m, n), np.float32), np.empty((m, n), np.float32)
    native.linear_bf16(tiles, x, packed, k, n)
    native.linear_bf16_vector(vector, x, packed, k, n)
    _, bound = reference(x, w)
    assert np.all(np.abs(tiles - vector) <= bound)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 40),
    k=st.integers(1, 600),
    n=st.integers(1, 300),
    num_threads=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_any_shape_matches_bf16_reference(m: int, k: int, n: int, num_threads: int, seed: int) -> None:
    for impl in IMPLEMENTATIONS.values():
        check(impl, m, k, n, seed, num_threads)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS)
def test_accumulate_adds_to_out(impl: LinearFn) -> None:
    x, w = operands(45, 300, 200, seed=3)
    residual = np.random.default_rng(4).standard_normal((45, 200), dtype=np.float32)
    out = residual.copy()
    impl(out, x, native.pack_bf16(w), 300, 200, accumulate=True)
    expected, bound = reference(x, w)
    assert np.all(np.abs(out - (residual + expected)) <= bound + 2.0**-23 * np.abs(residual))


@pytest.mark.parametrize("impl", IMPLEMENTATIONS.values(), ids=IMPLEMENTATIONS)
def test_x_is_rounded_to_nearest_even_bf16(impl: LinearFn) -> None:
    # Ties, their neighbours, big and tiny (but normal) values; times the identity, the result is exact.
    ones = np.float32(1) + np.float32(2**-8) * np.arange(-8, 9, dtype=np.float32)
    x = np.concatenate([ones, -ones * 3e5, ones * 1e-30, np.array([3e38, 0.0, -0.0, 1.0], dtype=np.float32)])[
        None, :
    ]
    k = x.shape[1]
    out = np.empty_like(x)
    impl(out, x, native.pack_bf16(np.eye(k, dtype=np.float32)), k, k)
    np.testing.assert_array_equal(out, bf16_round(x))


def test_pack_layout_pairs_rows_of_each_tile() -> None:
    k, n = 5, 70
    w = np.arange(k * n, dtype=np.float32).reshape(k, n) + 0.5
    packed = native.pack_bf16(w)
    k2, num_tiles = (k + 1) // 2, -(-n // TILE_N)
    assert packed.dtype == np.uint16 and packed.shape == (num_tiles, k2, 2 * TILE_N)
    assert packed.ctypes.data % 64 == 0
    bits = (bf16_round(w).view(np.uint32) >> 16).astype(np.uint16)
    padded = np.zeros((2 * k2, num_tiles * TILE_N), dtype=np.uint16)
    padded[:k, :n] = bits
    # padded[2p + i, t * TILE_N + j] sits at packed[t, p, 2j + i]
    expected = padded.reshape(k2, 2, num_tiles, TILE_N).transpose(2, 0, 3, 1).reshape(packed.shape)
    np.testing.assert_array_equal(packed, expected)


def test_pack_rounds_like_bf16_round() -> None:
    rng = np.random.default_rng(5)
    specials = np.array(
        [np.nan, -np.nan, np.inf, -np.inf, 3.4028235e38, 0.0, -0.0, 1.00390625, 1.01171875], dtype=np.float32
    )
    w = np.concatenate([specials, rng.standard_normal(55, dtype=np.float32) * 1e3])[:, None]  # K=64, N=1
    packed = native.pack_bf16(w)
    got = packed[0, :, 0:2].reshape(-1)  # column 0: the pairs (w[2p], w[2p+1])
    want = (bf16_round(w[:, 0]).view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(got, want)


def test_packed_linear_wrapper() -> None:
    x, w = operands(20, 100, 90, seed=6)
    layer = PackedLinear(w)
    expected, bound = reference(x, w)
    assert np.all(np.abs(layer(x) - expected) <= bound)
    out = np.ones((20, 90), dtype=np.float32)
    assert layer(x, out=out, accumulate=True) is out
    assert np.all(np.abs(out - (expected + 1)) <= bound + 2.0**-23)
    assert layer(np.empty((0, 100), np.float32)).shape == (0, 90)
    assert (layer.in_features, layer.out_features) == (100, 90)
    assert KERNEL_SIMD in ("avx512_bf16", "portable")
    assert KERNEL_TILES in ("amx_bf16", "")
    assert not KERNEL_TILES or KERNEL_SIMD == "avx512_bf16"  # AMX is only built beside the vector kernel


def test_concurrent_callers_keep_their_own_scratch() -> None:
    # The GIL is released during a call, and x's bf16 copy is per calling thread.
    layer = PackedLinear(operands(1, 256, 512, seed=7)[1])
    inputs = [operands(m, 256, 1, seed=m)[0] for m in (3, 64, 160, 17)]
    expected = [layer(x) for x in inputs]
    failures: list[int] = []

    def run(i: int) -> None:
        for _ in range(50):
            if not np.array_equal(layer(inputs[i]), expected[i]):
                failures.append(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


# ---- argument checking ----


def _valid() -> dict[str, Any]:
    x, w = operands(4, 10, 70)
    return {"out": np.zeros((4, 70), np.float32), "x": x, "packed": native.pack_bf16(w), "K": 10, "N": 70}


def _with(**changes: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda a: {**a, **{name: change(a) for name, change in changes.items()}}


BAD_ARGUMENTS = {
    "x not an array": (_with(x=lambda a: a["x"].tolist()), TypeError, "x must be a numpy.ndarray"),
    "x float64": (_with(x=lambda a: a["x"].astype(np.float64)), TypeError, "x must have dtype float32"),
    "x big-endian": (_with(x=lambda a: a["x"].astype(">f4")), TypeError, "x must have dtype float32"),
    "out float16": (_with(out=lambda a: a["out"].astype(np.float16)), TypeError, "out must have dtype"),
    "packed float32": (
        _with(packed=lambda a: a["packed"].astype(np.float32)),
        TypeError,
        "packed must have dtype uint16",
    ),
    "x 1-D": (_with(x=lambda a: a["x"][0].copy()), ValueError, "x must have 2 dimensions"),
    "x non-contiguous": (_with(x=lambda a: np.repeat(a["x"], 2, axis=1)[:, ::2]), ValueError, "C-contiguous"),
    "x wrong K": (_with(x=lambda a: a["x"][:, :9].copy()), ValueError, "x must have K = 10 columns"),
    "out wrong M": (_with(out=lambda a: a["out"][:3].copy()), ValueError, "out must have shape [M, N]"),
    "out wrong N": (_with(out=lambda a: a["out"][:, :69].copy()), ValueError, "out must have shape [M, N]"),
    "out read-only": (
        _with(out=lambda a: np.lib.stride_tricks.as_strided(a["out"], writeable=False)),
        ValueError,
        "writeable",
    ),
    "packed for another K": (_with(K=lambda a: 12), ValueError, "pack_bf16 of a [12, 70] weight"),
    "packed for another N": (_with(N=lambda a: 129), ValueError, "pack_bf16 of a [10, 129] weight"),
    "packed 2-D": (_with(packed=lambda a: a["packed"][0]), ValueError, "packed must have 3 dimensions"),
    "K zero": (_with(K=lambda a: 0), ValueError, "K and N must be >= 1"),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS.values()), ids=list(BAD_ARGUMENTS))
def test_bad_arguments_raise_clearly(case: tuple[Callable, type[Exception], str]) -> None:
    change, error, message = case
    a = change(_valid())
    for impl in IMPLEMENTATIONS.values():
        with pytest.raises(error, match=re.escape(message)):
            impl(a["out"], a["x"], a["packed"], a["K"], a["N"])


def test_out_overlapping_x_is_refused() -> None:
    a = _valid()
    buffer = np.zeros(4 * 70 + 4 * 10, np.float32)
    x, out = buffer[:40].reshape(4, 10), buffer[20:300].reshape(4, 70)
    with pytest.raises(ValueError, match="must not overlap"):
        native.linear_bf16(out, x, a["packed"], 10, 70)


def test_negative_thread_count_is_refused() -> None:
    a = _valid()
    with pytest.raises(ValueError, match="num_threads must be >= 0"):
        native.linear_bf16(a["out"], a["x"], a["packed"], 10, 70, num_threads=-1)


@pytest.mark.parametrize(
    ("weight", "error", "message"),
    [
        (np.ones((4, 4), np.float64), TypeError, "weight must be a float32 numpy.ndarray"),
        ([[1.0]], TypeError, "weight must be a float32 numpy.ndarray, got list"),
        (np.ones(4, np.float32), ValueError, "weight must be [K, N]"),
        (np.ones((0, 4), np.float32), ValueError, "weight must be [K, N]"),
    ],
)
def test_packed_linear_rejects_bad_weights(weight: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=re.escape(message)):
        PackedLinear(weight)


def test_packed_linear_rejects_bad_calls() -> None:
    layer = PackedLinear(np.ones((8, 3), np.float32))
    with pytest.raises(ValueError, match="accumulate=True needs out"):
        layer(np.ones((2, 8), np.float32), accumulate=True)
    with pytest.raises(TypeError, match="x must be a 2-D float32"):
        layer(np.ones(8, np.float32))
    with pytest.raises(TypeError, match="x must have dtype float32"):
        layer(np.ones((2, 8), np.float64))


def test_pack_rejects_bad_weights() -> None:
    with pytest.raises(TypeError, match="w must have dtype float32"):
        native.pack_bf16(np.ones((2, 2), np.float64))
    with pytest.raises(ValueError, match="w must be C-contiguous"):
        native.pack_bf16(np.ones((4, 4), np.float32).T)
    with pytest.raises(ValueError, match="K >= 1 rows and N >= 1 columns"):
        native.pack_bf16(np.ones((3, 0), np.float32))


# ---- threads ----


def test_importing_the_wrapper_makes_openmp_threads_sleep_when_idle() -> None:
    # In a fresh interpreter (torch, loaded by other tests, brings its own libgomp and would mask this).
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMP_DISPLAY_ENV"] = "TRUE"
    done = subprocess.run(
        [sys.executable, "-c", "import cpu_engine.linear"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in done.stderr
