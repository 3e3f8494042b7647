"""The paged attention kernel against its numpy reference and torch, and its argument checking."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpu_engine import _paged_attention as native
from cpu_engine.attention import paged_attention, reference_paged_attention, write_kv

RTOL, ATOL = 1e-5, 2e-6


def _portable(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_index: np.ndarray,
    positions: np.ndarray,
    scale: float,
) -> np.ndarray:
    """The kernel's portable C path (the one non-AVX-512 builds use), with the wrapper's signature."""
    out = np.empty_like(q)
    native.paged_attention_portable(out, q, k_cache, v_cache, block_tables, seq_index, positions, scale)
    return out


IMPLEMENTATIONS: dict[str, Callable[..., np.ndarray]] = {"native": paged_attention, "portable": _portable}


@dataclass
class Batch:
    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray
    block_tables: np.ndarray
    seq_index: np.ndarray
    positions: np.ndarray
    scale: float

    def args(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.seq_index,
            self.positions,
            self.scale,
        )


def make_batch(
    rng: np.random.Generator,
    seqs: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    shuffle_tokens: bool = False,
) -> Batch:
    """seqs: (cached prefix tokens, new tokens) per sequence. Every new token's key/value is written
    (with write_kv) before attention, as the model does; blocks are scattered over a larger pool and
    unused block-table entries are -1, which the kernel must never read."""
    lengths = [prefix + new for prefix, new in seqs]
    blocks_per_seq = [-(-length // block_size) for length in lengths]
    num_blocks = sum(blocks_per_seq) + 3
    max_blocks = max(blocks_per_seq) + 1
    pool = rng.permutation(num_blocks).astype(np.int32)
    block_tables = np.full((len(seqs), max_blocks), -1, dtype=np.int32)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = rng.standard_normal(cache_shape, dtype=np.float32)  # garbage where nothing was written
    v_cache = rng.standard_normal(cache_shape, dtype=np.float32)
    seq_index, positions = [], []
    taken = 0
    for s, ((prefix, new), length) in enumerate(zip(seqs, lengths, strict=True)):
        block_tables[s, : blocks_per_seq[s]] = pool[taken : taken + blocks_per_seq[s]]
        taken += blocks_per_seq[s]
        pos = np.arange(length)
        slots = block_tables[s, pos // block_size].astype(np.int64) * block_size + pos % block_size
        kv_shape = (length, num_kv_heads, head_dim)
        write_kv(
            k_cache,
            v_cache,
            rng.standard_normal(kv_shape, dtype=np.float32),
            rng.standard_normal(kv_shape, dtype=np.float32),
            slots,
        )
        seq_index += [s] * new
        positions += list(range(prefix, length))
    order = rng.permutation(len(positions)) if shuffle_tokens else np.arange(len(positions))
    return Batch(
        q=rng.standard_normal((len(positions), num_heads, head_dim), dtype=np.float32),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        seq_index=np.asarray(seq_index, dtype=np.int32)[order],
        positions=np.asarray(positions, dtype=np.int32)[order],
        scale=head_dim**-0.5,
    )


def assert_matches_reference(batch: Batch, impl: Callable[..., np.ndarray]) -> None:
    np.testing.assert_allclose(
        impl(*batch.args()), reference_paged_attention(*batch.args()), rtol=RTOL, atol=ATOL
    )


# Each: (cached prefix, new tokens) per sequence.
BATCH_KINDS = {
    "decode": [(0, 1), (14, 1), (15, 1), (16, 1), (63, 1), (150, 1)],
    "prefill": [(0, 23), (37, 29)],  # a fresh prompt, and a chunk continuing a cached prefix
    "mixed": [(40, 1), (0, 1), (95, 1), (50, 17), (3, 5)],
}


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS.values()), ids=list(IMPLEMENTATIONS))
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", list(BATCH_KINDS))
def test_matches_reference(kind: str, group: int, head_dim: int, block_size: int, impl: Callable) -> None:
    rng = np.random.default_rng([group, head_dim, block_size])
    batch = make_batch(
        rng, BATCH_KINDS[kind], 2 * group, 2, head_dim, block_size, shuffle_tokens=kind == "mixed"
    )
    assert_matches_reference(batch, impl)


@settings(max_examples=40, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 12)), min_size=1, max_size=4),
    num_kv_heads=st.integers(1, 3),
    group=st.integers(1, 5),
    head_dim=st.sampled_from([1, 8, 16, 17, 40, 64, 80, 96, 128, 130]),
    block_size=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_shape_matches_reference(
    seqs: list[tuple[int, int]], num_kv_heads: int, group: int, head_dim: int, block_size: int, seed: int
) -> None:
    batch = make_batch(
        np.random.default_rng(seed),
        seqs,
        num_kv_heads * group,
        num_kv_heads,
        head_dim,
        block_size,
        shuffle_tokens=True,
    )
    for impl in IMPLEMENTATIONS.values():
        assert_matches_reference(batch, impl)


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS.values()), ids=list(IMPLEMENTATIONS))
def test_large_scores_stay_finite(impl: Callable) -> None:
    # Scores in the thousands: only a running-max softmax keeps exp() in range.
    batch = make_batch(np.random.default_rng(7), [(0, 40), (200, 1)], 4, 2, 64, 16)
    batch = replace(batch, q=batch.q * 300)
    out = impl(*batch.args())
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, reference_paged_attention(*batch.args()), rtol=1e-4, atol=1e-5)


def test_matches_torch_causal_sdpa_on_one_dense_sequence() -> None:
    torch = pytest.importorskip("torch")
    num_tokens, num_heads, num_kv_heads, head_dim, block_size = 75, 8, 2, 64, 16
    rng = np.random.default_rng(3)
    q = rng.standard_normal((num_tokens, num_heads, head_dim), dtype=np.float32)
    k = rng.standard_normal((num_tokens, num_kv_heads, head_dim), dtype=np.float32)
    v = rng.standard_normal((num_tokens, num_kv_heads, head_dim), dtype=np.float32)
    num_blocks = -(-num_tokens // block_size)
    block_tables = rng.permutation(num_blocks + 2)[None, :num_blocks].astype(np.int32)
    cache_shape = (num_blocks + 2, block_size, num_kv_heads, head_dim)
    k_cache, v_cache = np.zeros(cache_shape, np.float32), np.zeros(cache_shape, np.float32)
    pos = np.arange(num_tokens, dtype=np.int32)
    write_kv(
        k_cache,
        v_cache,
        k,
        v,
        block_tables[0, pos // block_size].astype(np.int64) * block_size + pos % block_size,
    )

    out = paged_attention(
        q, k_cache, v_cache, block_tables, np.zeros(num_tokens, np.int32), pos, head_dim**-0.5
    )

    group = num_heads // num_kv_heads
    expected = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q).transpose(0, 1),  # [heads, tokens, head_dim]
        torch.from_numpy(k).transpose(0, 1).repeat_interleave(group, dim=0),
        torch.from_numpy(v).transpose(0, 1).repeat_interleave(group, dim=0),
        is_causal=True,
    ).transpose(0, 1)
    np.testing.assert_allclose(out, expected.numpy(), rtol=RTOL, atol=ATOL)


def test_out_is_filled_in_place_and_may_be_q() -> None:
    batch = make_batch(np.random.default_rng(5), BATCH_KINDS["mixed"], 4, 2, 64, 16)
    expected = reference_paged_attention(*batch.args())
    out = np.empty_like(batch.q)
    assert paged_attention(*batch.args(), out=out) is out
    q = batch.q.copy()
    assert paged_attention(q, *batch.args()[1:], out=q) is q
    np.testing.assert_allclose(q, expected, rtol=RTOL, atol=ATOL)


def test_empty_batch() -> None:
    batch = make_batch(np.random.default_rng(6), [(3, 1)], 4, 2, 64, 16)
    empty = np.empty((0,), np.int32)
    out = paged_attention(batch.q[:0], batch.k_cache, batch.v_cache, batch.block_tables, empty, empty, 0.125)
    assert out.shape == (0, 4, 64)


# ---- argument checking ----


def _valid() -> dict[str, Any]:
    batch = make_batch(np.random.default_rng(9), [(20, 1), (0, 3)], 4, 2, 64, 16)
    return {**batch.__dict__, "out": np.empty_like(batch.q)}


def _with(**changes: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda a: {**a, **{name: change(a) for name, change in changes.items()}}


def _set_block(a: dict[str, Any], value: int) -> np.ndarray:
    tables = a["block_tables"].copy()
    tables[0, 1] = value  # sequence 0 (position 20) reads its blocks 0 and 1
    return tables


BAD_ARGUMENTS = {
    "q not an array": (_with(q=lambda a: a["q"].tolist()), TypeError, "q must be a numpy.ndarray"),
    "q float64": (_with(q=lambda a: a["q"].astype(np.float64)), TypeError, "q must have dtype float32"),
    "k_cache float16": (
        _with(k_cache=lambda a: a["k_cache"].astype(np.float16)),
        TypeError,
        "k_cache must have dtype",
    ),
    "positions big-endian": (
        _with(positions=lambda a: a["positions"].astype(">i4")),
        TypeError,
        "positions must have dtype int32, got >i4",
    ),
    "block_tables int64": (
        _with(block_tables=lambda a: a["block_tables"].astype(np.int64)),
        TypeError,
        "block_tables must have dtype int32",
    ),
    "positions int64": (
        _with(positions=lambda a: a["positions"].astype(np.int64)),
        TypeError,
        "positions must",
    ),
    "q non-contiguous": (
        _with(q=lambda a: np.repeat(a["q"], 2, axis=2)[:, :, ::2]),
        ValueError,
        "q must be C-contiguous",
    ),
    "k_cache non-contiguous": (
        _with(k_cache=lambda a: a["k_cache"][:, ::-1]),
        ValueError,
        "k_cache must be C-contiguous",
    ),
    "v_cache of another shape": (_with(v_cache=lambda a: a["v_cache"][:-1].copy()), ValueError, "same shape"),
    "q 2-D": (_with(q=lambda a: a["q"].reshape(len(a["q"]), -1)), ValueError, "q must have 3 dimensions"),
    "head_dim mismatch": (
        _with(q=lambda a: a["q"][:, :, :32].copy(), out=lambda a: a["out"][:, :, :32].copy()),
        ValueError,
        "head_dim differs",
    ),
    "heads not a multiple of kv heads": (
        _with(q=lambda a: a["q"][:, :3].copy(), out=lambda a: a["out"][:, :3].copy()),
        ValueError,
        "multiple of num_kv_heads",
    ),
    "positions too short": (_with(positions=lambda a: a["positions"][:-1].copy()), ValueError, "num_tokens"),
    "out wrong shape": (
        _with(out=lambda a: a["out"][:-1].copy()),
        ValueError,
        "out must have the shape of q",
    ),
    "out read-only": (
        _with(out=lambda a: np.lib.stride_tricks.as_strided(a["out"], writeable=False)),
        ValueError,
        "writeable",
    ),
    "out overlaps k_cache": (
        _with(out=lambda a: a["k_cache"].reshape(-1)[: a["q"].size].reshape(a["q"].shape)),
        ValueError,
        "overlap",
    ),
    "block id too large": (
        _with(block_tables=lambda a: _set_block(a, len(a["k_cache"]))),
        ValueError,
        "block_tables[0, 1]",
    ),
    "block id negative": (_with(block_tables=lambda a: _set_block(a, -1)), ValueError, "block_tables[0, 1]"),
    "position beyond the table": (
        _with(positions=lambda a: a["positions"] + 16 * a["block_tables"].shape[1]),
        ValueError,
        "outside the block table",
    ),
    "position negative": (
        _with(positions=lambda a: a["positions"] - 100),
        ValueError,
        "outside the block table",
    ),
    "seq_index out of range": (_with(seq_index=lambda a: a["seq_index"] + 2), ValueError, "seq_index"),
    "scale nan": (_with(scale=lambda a: float("nan")), ValueError, "scale must be finite"),
}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS.values()), ids=list(BAD_ARGUMENTS))
def test_bad_arguments_raise_clearly(case: tuple[Callable, type[Exception], str]) -> None:
    change, error, message = case
    a = change(_valid())
    with pytest.raises(error, match=re.escape(message)):
        paged_attention(
            a["q"],
            a["k_cache"],
            a["v_cache"],
            a["block_tables"],
            a["seq_index"],
            a["positions"],
            a["scale"],
            out=a["out"],
        )


def test_valid_arguments_pass() -> None:
    a = _valid()
    paged_attention(
        a["q"],
        a["k_cache"],
        a["v_cache"],
        a["block_tables"],
        a["seq_index"],
        a["positions"],
        a["scale"],
        out=a["out"],
    )


# ---- write_kv ----


def test_write_kv_stores_each_token_at_its_slot() -> None:
    rng = np.random.default_rng(11)
    k_cache, v_cache = np.zeros((4, 16, 2, 8), np.float32), np.zeros((4, 16, 2, 8), np.float32)
    k, v = rng.standard_normal((3, 2, 8), dtype=np.float32), rng.standard_normal((3, 2, 8), dtype=np.float32)
    write_kv(k_cache, v_cache, k, v, np.array([0, 17, 63]))
    np.testing.assert_array_equal(k_cache[[0, 1, 3], [0, 1, 15]], k)
    np.testing.assert_array_equal(v_cache[[0, 1, 3], [0, 1, 15]], v)
    assert np.count_nonzero(k_cache) == k.size


@pytest.mark.parametrize(
    ("slots", "k_shape", "message"),
    [
        ([0, -1], (2, 2, 8), "slots must lie in"),
        ([0, 64], (2, 2, 8), "slots must lie in"),
        ([0, 1], (1, 2, 8), "want k and v of shape"),
        ([0, 1], (2, 1, 8), "want k and v of shape"),
    ],
)
def test_write_kv_rejects_bad_slots_and_shapes(
    slots: list[int], k_shape: tuple[int, ...], message: str
) -> None:
    cache = np.zeros((4, 16, 2, 8), np.float32)
    k = np.ones(k_shape, np.float32)
    with pytest.raises(ValueError, match=message):
        write_kv(cache, cache.copy(), k, k, np.array(slots))


# ---- threads ----


def test_importing_the_wrapper_makes_openmp_threads_sleep_when_idle() -> None:
    # In a fresh interpreter (torch, loaded by other tests, brings its own libgomp and would mask this).
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMP_DISPLAY_ENV"] = "TRUE"
    done = subprocess.run(
        [sys.executable, "-c", "import cpu_engine.attention"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in done.stderr
