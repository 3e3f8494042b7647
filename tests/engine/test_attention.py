"""The paged attention kernel against its numpy reference and torch, over float32 and bf16 KV caches, and
its argument checking; the KV write and the engine's KV cache."""

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
from cpu_engine.attention import paged_attention, reference_paged_attention, to_bf16_bits, write_kv
from cpu_engine.config import LinearDType, ModelConfig
from cpu_engine.linear import bf16_round
from cpu_engine.model import KVCache

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
    kv_dtype: LinearDType = "float32",
) -> Batch:
    """seqs: (cached prefix tokens, new tokens) per sequence. Every new token's key/value is written
    (with write_kv) before attention, as the model does; blocks are scattered over a larger pool and
    unused block-table entries are -1, which the kernel must never read. kv_dtype "bfloat16" makes
    uint16 (bf16 bits) caches."""
    lengths = [prefix + new for prefix, new in seqs]
    blocks_per_seq = [-(-length // block_size) for length in lengths]
    num_blocks = sum(blocks_per_seq) + 3
    max_blocks = max(blocks_per_seq) + 1
    pool = rng.permutation(num_blocks).astype(np.int32)
    block_tables = np.full((len(seqs), max_blocks), -1, dtype=np.int32)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = rng.standard_normal(cache_shape, dtype=np.float32)  # garbage where nothing was written
    v_cache = rng.standard_normal(cache_shape, dtype=np.float32)
    if kv_dtype == "bfloat16":
        k_cache, v_cache = to_bf16_bits(k_cache), to_bf16_bits(v_cache)
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


KV_DTYPES: list[LinearDType] = ["float32", "bfloat16"]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS.values()), ids=list(IMPLEMENTATIONS))
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", list(BATCH_KINDS))
def test_matches_reference(
    kind: str, group: int, head_dim: int, block_size: int, impl: Callable, kv_dtype: LinearDType
) -> None:
    rng = np.random.default_rng([group, head_dim, block_size])
    batch = make_batch(
        rng,
        BATCH_KINDS[kind],
        2 * group,
        2,
        head_dim,
        block_size,
        shuffle_tokens=kind == "mixed",
        kv_dtype=kv_dtype,
    )
    assert_matches_reference(batch, impl)


def test_bf16_cache_is_the_float32_cache_rounded() -> None:
    # The same batch through both cache dtypes: bf16 storage is the only difference, and it is small.
    f32 = make_batch(np.random.default_rng(12), BATCH_KINDS["mixed"], 4, 2, 64, 16)
    bf16 = replace(f32, k_cache=to_bf16_bits(f32.k_cache), v_cache=to_bf16_bits(f32.v_cache))
    rounded = replace(f32, k_cache=bf16_round(f32.k_cache), v_cache=bf16_round(f32.v_cache))
    np.testing.assert_allclose(
        paged_attention(*bf16.args()), paged_attention(*rounded.args()), rtol=RTOL, atol=ATOL
    )
    np.testing.assert_allclose(paged_attention(*bf16.args()), paged_attention(*f32.args()), atol=2e-2)


@settings(max_examples=40, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(0, 70), st.integers(1, 12)), min_size=1, max_size=4),
    num_kv_heads=st.integers(1, 3),
    group=st.integers(1, 5),
    head_dim=st.sampled_from([1, 8, 16, 17, 40, 64, 80, 96, 128, 130]),
    block_size=st.integers(1, 40),
    seed=st.integers(0, 2**32 - 1),
    kv_dtype=st.sampled_from(KV_DTYPES),
)
def test_any_shape_matches_reference(
    seqs: list[tuple[int, int]],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    seed: int,
    kv_dtype: LinearDType,
) -> None:
    batch = make_batch(
        np.random.default_rng(seed),
        seqs,
        num_kv_heads * group,
        num_kv_heads,
        head_dim,
        block_size,
        shuffle_tokens=True,
        kv_dtype=kv_dtype,
    )
    for impl in IMPLEMENTATIONS.values():
        assert_matches_reference(batch, impl)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS.values()), ids=list(IMPLEMENTATIONS))
def test_large_scores_stay_finite(impl: Callable, kv_dtype: LinearDType) -> None:
    # Scores in the thousands: only a running-max softmax keeps exp() in range.
    batch = make_batch(np.random.default_rng(7), [(0, 40), (200, 1)], 4, 2, 64, 16, kv_dtype=kv_dtype)
    batch = replace(batch, q=batch.q * 300)
    out = impl(*batch.args())
    assert np.isfinite(out).all()
    # NOTE: scores here are ~1e3, so float32 rounding of a score moves its weight by ~1e-4 relative; over
    # seeds 7..16 either cache dtype is off by up to 8e-5 absolute (the former atol 1e-5 passed by luck).
    np.testing.assert_allclose(out, reference_paged_attention(*batch.args()), rtol=1e-4, atol=1e-4)


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
        "k_cache must have dtype float32 or uint16 (bfloat16 bits), got float16",
    ),
    "v_cache big-endian bf16": (
        _with(
            k_cache=lambda a: to_bf16_bits(a["k_cache"]),
            v_cache=lambda a: to_bf16_bits(a["v_cache"]).astype(">u2"),
        ),
        TypeError,
        "v_cache must have dtype float32 or uint16 (bfloat16 bits), got >u2",
    ),
    "bf16 keys, float32 values": (
        _with(k_cache=lambda a: to_bf16_bits(a["k_cache"])),
        TypeError,
        "k_cache and v_cache must have the same dtype, got uint16 and float32",
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


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_valid_arguments_pass(kv_dtype: LinearDType) -> None:
    a = _valid()
    if kv_dtype == "bfloat16":
        a["k_cache"], a["v_cache"] = to_bf16_bits(a["k_cache"]), to_bf16_bits(a["v_cache"])
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


def _bits(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint32).view(np.float32)


# Ties (exactly half an ulp of bf16) both ways, one past a tie, the largest finite float32 (rounds to
# infinity), a subnormal, signed zeros and infinities, and NaNs whose rounding carry would reach the sign
# or the exponent.
BF16_EDGES = np.concatenate(
    [
        _bits(0x3F808000, 0x3F818000, 0x3F808001, 0xBF818000, 0x7F7FFFFF, 0x00018000, 0x00000001),
        np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -2.5, 1e-3], np.float32),
        _bits(0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF),
    ]
)


def test_to_bf16_bits_rounds_to_nearest_even_and_keeps_nan() -> None:
    bits = to_bf16_bits(BF16_EDGES)
    assert bits.dtype == np.uint16
    np.testing.assert_array_equal(bits[:7], [0x3F80, 0x3F82, 0x3F81, 0xBF82, 0x7F80, 0x0002, 0x0000])
    nan = np.isnan(BF16_EDGES)
    widened = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    assert np.isnan(widened[nan]).all()
    np.testing.assert_array_equal(widened[~nan], bf16_round(BF16_EDGES[~nan]))
    # Ordinary values: the upper half of bf16_round's bits, exactly.
    x = np.random.default_rng(13).standard_normal(10_000).astype(np.float32) * np.float32(1e4)
    widened = (to_bf16_bits(x).astype(np.uint32) << np.uint32(16)).view(np.float32)
    np.testing.assert_array_equal(widened, bf16_round(x))


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_write_kv_into_bf16_caches_rounds_exactly(num_kv_heads: int) -> None:
    rng = np.random.default_rng(14)
    num_tokens, head_dim = 5, len(BF16_EDGES)
    shape = (4, 8, num_kv_heads, head_dim)
    k_cache, v_cache = np.zeros(shape, np.uint16), np.zeros(shape, np.uint16)
    k = rng.standard_normal((num_tokens, num_kv_heads, head_dim), dtype=np.float32)
    k[0, 0] = BF16_EDGES
    # v as the model makes it: a column slice of the fused qkv output (rows not adjacent).
    qkv = rng.standard_normal((num_tokens, 3 * num_kv_heads * head_dim), dtype=np.float32)
    v = qkv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].reshape(k.shape)
    slots = np.array([31, 0, 9, 17, 8])
    write_kv(k_cache, v_cache, k, v, slots)
    np.testing.assert_array_equal(k_cache.reshape(-1, num_kv_heads, head_dim)[slots], to_bf16_bits(k))
    np.testing.assert_array_equal(v_cache.reshape(-1, num_kv_heads, head_dim)[slots], to_bf16_bits(v))
    assert np.count_nonzero(k_cache) == np.count_nonzero(to_bf16_bits(k))


def test_write_kv_rejects_mixed_cache_dtypes() -> None:
    cache = np.zeros((4, 16, 2, 8), np.float32)
    k = np.ones((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match="differ"):
        write_kv(cache, cache.astype(np.uint16), k, k, np.array([0]))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda a: {**a, "slots": np.array([0, 64])}, ValueError, "slot_mapping[1] = 64 is outside"),
        (lambda a: {**a, "slots": np.array([-1, 0])}, ValueError, "slot_mapping[0] = -1 is outside"),
        (
            lambda a: {**a, "slots": np.array([0, 1], np.int32)},
            TypeError,
            "slot_mapping must have dtype int64",
        ),
        (lambda a: {**a, "x": a["x"][:, :1].copy()}, ValueError, "want x of shape [2, 2, 8]"),
        (lambda a: {**a, "x": a["x"].astype(np.float64)}, TypeError, "x must be a float32"),
        (lambda a: {**a, "x": a["x"][:, ::-1]}, ValueError, "row of x must be contiguous"),
        (lambda a: {**a, "cache": a["cache"].astype(np.float32)}, TypeError, "cache must have dtype uint16"),
        (
            lambda a: {**a, "cache": np.lib.stride_tricks.as_strided(a["cache"], writeable=False)},
            ValueError,
            "writeable",
        ),
        (
            lambda a: {**a, "x": a["cache"].view(np.float32).reshape(-1)[:32].reshape(2, 2, 8)},
            ValueError,
            "must not overlap",
        ),
    ],
)
def test_native_bf16_write_checks_its_arguments(
    change: Callable, error: type[Exception], message: str
) -> None:
    a = change(
        {
            "cache": np.zeros((4, 16, 2, 8), np.uint16),
            "x": np.ones((2, 2, 8), np.float32),
            "slots": np.array([0, 1]),
        }
    )
    with pytest.raises(error, match=re.escape(message)):
        native.write_kv_bf16(a["cache"], a["x"], a["slots"])


# ---- the engine's KV cache ----


@pytest.mark.parametrize(("dtype", "element"), [("float32", np.float32), ("bfloat16", np.uint16)])
def test_kv_cache_follows_the_engine_dtype(dtype: LinearDType, element: type) -> None:
    cfg = ModelConfig.from_dict(
        {
            "vocab_size": 8,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        }
    )
    kv = KVCache(cfg, 6, 16, dtype=dtype)
    assert all(a.dtype == element and a.shape == (6, 16, 2, 8) for a in kv.keys + kv.values)
    assert kv.num_bytes == 6 * 16 * cfg.kv_bytes_per_token * np.dtype(element).itemsize // 4
    rng = np.random.default_rng(15)
    for layer_k, layer_v in zip(kv.keys, kv.values, strict=True):
        k = rng.standard_normal((16, 2, 8), dtype=np.float32)
        write_kv(layer_k, layer_v, k, -k, np.arange(16, 32))  # block 1
    kv.copy_blocks([(1, 4)])
    for layer_k, layer_v in zip(kv.keys, kv.values, strict=True):
        np.testing.assert_array_equal(layer_k[4], layer_k[1])
        np.testing.assert_array_equal(layer_v[4], layer_v[1])
        assert np.count_nonzero(layer_k[1])


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
