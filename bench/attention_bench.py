"""Per-call time of the paged attention kernel, over a float32 and a bf16 KV cache, against the best
plain-numpy gather + matmul we could write (float32).

Shapes are the dev model's (4 heads, 2 kv heads, head_dim 64, block 16): decode of 32 and 64 sequences at
context 192, and one 512-token prefill chunk. Prints the median of repeated runs, in ms; the two cache
dtypes are timed in alternation, call by call, so that noise from other processes hits both alike.

    python bench/attention_bench.py [--repeats 200] [--num-caches 1] [--interleave]

--num-caches N cycles each call through N independent KV caches of the same shape, as the engine's layers
do; with N large enough that they outgrow the L3 cache (about 12 here), every call reads from DRAM.
--interleave also times kernel calls alternating with a numpy matmul of a layer's size (the engine's
pattern), to show whether idle kernel threads steal CPU from OpenBLAS (see OMP_WAIT_POLICY in
cpu_engine/attention.py).

--baseline REV builds the kernel as it was at git revision REV (with setup.py's flags, into a temporary
directory) and times it against the one installed, call by call, on the shapes above and on the seed
mix's (32 decodes at context 1,100, a 1,000-token prompt), over both cache dtypes: before/after figures
from one run.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import itertools
import subprocess
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from cpu_engine.attention import KERNEL_SIMD, paged_attention, reference_paged_attention, to_bf16_bits
from cpu_engine.native import paged_attention_ext

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 64, 16


@dataclass
class Case:
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


def make_case(num_seqs: int, context_tokens: int, chunk_tokens: int, seed: int = 0) -> Case:
    """num_seqs sequences, each ending at context_tokens with its last chunk_tokens tokens queried."""
    rng = np.random.default_rng(seed)
    blocks_per_seq = -(-context_tokens // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq + 64
    cache_shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    perm = rng.permutation(num_blocks)[: num_seqs * blocks_per_seq]
    return Case(
        q=rng.standard_normal((num_seqs * chunk_tokens, NUM_HEADS, HEAD_DIM), dtype=np.float32),
        k_cache=rng.standard_normal(cache_shape, dtype=np.float32),
        v_cache=rng.standard_normal(cache_shape, dtype=np.float32),
        block_tables=perm.reshape(num_seqs, blocks_per_seq).astype(np.int32),
        seq_index=np.repeat(np.arange(num_seqs, dtype=np.int32), chunk_tokens),
        positions=np.tile(np.arange(context_tokens - chunk_tokens, context_tokens, dtype=np.int32), num_seqs),
        scale=HEAD_DIM**-0.5,
    )


def as_bf16_case(case: Case) -> Case:
    """The same case with its caches rounded to bfloat16 (uint16 bits)."""
    return replace(case, k_cache=to_bf16_bits(case.k_cache), v_cache=to_bf16_bits(case.v_cache))


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


_WORKSPACE: dict[tuple[str, tuple[int, ...]], np.ndarray] = {}


def _workspace(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 buffer kept across calls: fresh multi-MB temporaries would cost page faults every call."""
    if (name, shape) not in _WORKSPACE:
        _WORKSPACE[name, shape] = np.empty(shape, dtype=np.float32)
    return _WORKSPACE[name, shape]


def _gather(cache: np.ndarray, table: np.ndarray, name: str) -> np.ndarray:
    out = _workspace(name, table.shape + cache.shape[1:])
    return np.take(cache, table, axis=0, out=out, mode="clip")  # mode="raise" would buffer `out`


def numpy_decode(case: Case) -> np.ndarray:
    """One token per sequence: gather each sequence's blocks, then batched matmuls over (seq, kv head)."""
    num_seqs = case.block_tables.shape[0]
    group = NUM_HEADS // NUM_KV_HEADS
    keys = _gather(case.k_cache, case.block_tables, "keys").reshape(num_seqs, -1, NUM_KV_HEADS, HEAD_DIM)
    values = _gather(case.v_cache, case.block_tables, "values").reshape(num_seqs, -1, NUM_KV_HEADS, HEAD_DIM)
    q = case.q.reshape(num_seqs, NUM_KV_HEADS, group, HEAD_DIM) * np.float32(case.scale)
    scores = q @ keys.transpose(0, 2, 3, 1)  # [S, kv, group, L]
    beyond = np.arange(keys.shape[1])[None, :] > case.positions[:, None]  # [S, L]
    scores += np.where(beyond, -np.inf, 0).astype(np.float32)[:, None, None, :]
    out = _softmax_rows(scores) @ values.transpose(0, 2, 1, 3)  # [S, kv, group, d]
    return out.reshape(num_seqs, NUM_HEADS, HEAD_DIM)


def numpy_prefill(case: Case) -> np.ndarray:
    """One chunk of one sequence: gather its context once, one masked matmul per kv head."""
    num_tokens = case.q.shape[0]
    group = NUM_HEADS // NUM_KV_HEADS
    context = int(case.positions.max()) + 1
    table = case.block_tables[0, : -(-context // BLOCK_SIZE)]
    keys = _gather(case.k_cache, table, "keys").reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:context]  # [L, kv, d]
    values = _gather(case.v_cache, table, "values").reshape(-1, NUM_KV_HEADS, HEAD_DIM)[:context]
    # [kv, tokens * group, d]: the rows of one kv head's group side by side.
    q = (case.q * np.float32(case.scale)).reshape(num_tokens, NUM_KV_HEADS, group, HEAD_DIM)
    q = q.transpose(1, 0, 2, 3).reshape(NUM_KV_HEADS, num_tokens * group, HEAD_DIM)
    scores = _workspace("scores", (NUM_KV_HEADS, num_tokens * group, context))
    np.matmul(q, keys.transpose(1, 2, 0), out=scores)
    bias = np.where(np.arange(context)[None, :] > case.positions[:, None], -np.inf, 0).astype(np.float32)
    scores.reshape(NUM_KV_HEADS, num_tokens, group, context)[...] += bias[None, :, None, :]
    out = _softmax_rows(scores) @ values.transpose(1, 0, 2)  # [kv, tokens * group, d]
    return out.reshape(NUM_KV_HEADS, num_tokens, group, HEAD_DIM).transpose(1, 0, 2, 3).reshape(case.q.shape)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    return median_ms_alternating([fn], repeats)[0]


def median_ms_alternating(fns: list[Callable[[], object]], repeats: int) -> list[float]:
    """Median ms of each of fns, timed one call of each in turn."""
    for fn in fns:
        fn()  # warm-up: first touches, thread start
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, fn_times in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            fn_times.append(time.perf_counter() - start)
    return [float(np.median(fn_times)) * 1e3 for fn_times in times]


def bench_case(name: str, cases: list[Case], numpy_fn: Callable[[Case], np.ndarray], repeats: int) -> None:
    """Median per-call ms of the kernel over float32 and bf16 caches and of numpy_fn (float32), each call
    on the next of `cases` in turn."""
    out = np.empty_like(cases[0].q)
    bf16_cases = [as_bf16_case(case) for case in cases]
    for case in (cases[0], bf16_cases[0]):
        expected = reference_paged_attention(*case.args())
        np.testing.assert_allclose(paged_attention(*case.args(), out=out), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(
        numpy_fn(cases[0]), reference_paged_attention(*cases[0].args()), rtol=1e-4, atol=1e-5
    )
    f32_turn, bf16_turn = itertools.cycle(cases), itertools.cycle(bf16_cases)
    f32_ms, bf16_ms = median_ms_alternating(
        [
            lambda: paged_attention(*next(f32_turn).args(), out=out),
            lambda: paged_attention(*next(bf16_turn).args(), out=out),
        ],
        repeats,
    )
    numpy_ms = median_ms(lambda: numpy_fn(next(f32_turn)), max(repeats // 4, 5))
    print(
        f"{name:<34} kernel f32 {f32_ms:7.3f} ms   bf16 {bf16_ms:7.3f} ms (x{f32_ms / bf16_ms:4.2f})   "
        f"numpy f32 {numpy_ms:7.3f} ms"
    )


def bench_interleaved(case: Case, repeats: int) -> None:
    """Kernel + a [tokens, 256] x [256, 768] matmul in alternation, against the sum of each alone."""
    x = np.random.default_rng(1).standard_normal((case.q.shape[0], 256), dtype=np.float32)
    w = np.random.default_rng(2).standard_normal((256, 768), dtype=np.float32)
    out = np.empty_like(case.q)

    def kernel() -> None:
        paged_attention(*case.args(), out=out)

    def matmul() -> None:
        x @ w

    def both() -> None:
        matmul()
        kernel()

    alone = median_ms(kernel, repeats) + median_ms(matmul, repeats)
    print(
        f"interleaved matmul+kernel ({case.q.shape[0]} tokens): {median_ms(both, repeats):.3f} ms, "
        f"alone {alone:.3f} ms"
    )


KERNEL_SOURCE = "cpu_engine/csrc/paged_attention.c"
REPO_ROOT = Path(__file__).resolve().parent.parent


def compile_args() -> list[str]:
    """setup.py's COMPILE_ARGS (the flags `make install` builds the kernels with), read without running it."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text())
    for node in tree.body:
        names = [getattr(target, "id", None) for target in getattr(node, "targets", [])]
        if isinstance(node, ast.Assign) and "COMPILE_ARGS" in names:
            return list(ast.literal_eval(node.value))
    raise RuntimeError("setup.py has no COMPILE_ARGS")


def build_kernel_at(revision: str, build_dir: Path) -> ModuleType:
    """The attention extension compiled from ``KERNEL_SOURCE`` as it was at git ``revision`` (with the
    headers beside it at that revision)."""
    archive = subprocess.run(["git", "archive", revision, str(Path(KERNEL_SOURCE).parent)], cwd=REPO_ROOT,
                             check=True, capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(build_dir)], input=archive, check=True)
    library = build_dir / f"_paged_attention{sysconfig.get_config_var('EXT_SUFFIX')}"
    includes = [f"-I{sysconfig.get_paths()['include']}", f"-I{np.get_include()}"]
    source = str(build_dir / KERNEL_SOURCE)
    subprocess.run(["cc", "-shared", "-fPIC", *compile_args(), *includes, source, "-o", str(library)],
                   check=True)  # fmt: skip
    spec = importlib.util.spec_from_file_location("_paged_attention", library)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_against(revision: str, repeats: int) -> None:
    """The kernel at ``revision`` against the installed one, over a float32 and a bf16 KV cache (the
    engine's default), alternating call by call."""
    with tempfile.TemporaryDirectory() as tmp:
        old = build_kernel_at(revision, Path(tmp))
    cases = {
        "decode 32 seqs x 192 context": make_case(32, 192, 1),
        "decode 32 seqs x 1,100 context": make_case(32, 1100, 1),
        "prefill 512-token chunk (0..511)": make_case(1, 512, 512),
        "prefill 1,000-token prompt (0..999)": make_case(1, 1000, 1000),
    }
    print(f"| one layer ({KERNEL_SIMD}) | KV cache | {revision} ms | now ms | speed-up |")
    print("|---|---|---:|---:|---:|")
    for name, f32_case in cases.items():
        for kv_name, case in (("float32", f32_case), ("bfloat16", as_bf16_case(f32_case))):
            args = (np.empty_like(case.q), *case.args())

            def before(args: tuple[Any, ...] = args) -> None:
                old.paged_attention(*args)

            def now(args: tuple[Any, ...] = args) -> None:
                paged_attention_ext.paged_attention(*args)

            many = case.q.shape[0] < 100  # decode: fast calls, many of them
            before_ms, now_ms = median_ms_alternating(
                [before, now], repeats if many else max(repeats // 10, 10)
            )
            print(f"| {name} | {kv_name} | {before_ms:.2f} | {now_ms:.2f} | {before_ms / now_ms:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--num-caches", type=int, default=1)
    parser.add_argument("--interleave", action="store_true")
    parser.add_argument("--baseline", metavar="REV", help="also time the kernel as it was at git REV")
    args = parser.parse_args()
    print(
        f"kernel: {KERNEL_SIMD}; heads {NUM_HEADS}, kv heads {NUM_KV_HEADS}, head_dim {HEAD_DIM}, "
        f"block {BLOCK_SIZE}; {args.num_caches} KV cache(s) of each dtype in turn"
    )
    seeds = range(args.num_caches)
    for num_seqs in (32, 64):
        cases = [make_case(num_seqs, context_tokens=192, chunk_tokens=1, seed=seed) for seed in seeds]
        bench_case(f"decode {num_seqs} seqs x 192 context", cases, numpy_decode, args.repeats)
    prefills = [make_case(1, context_tokens=512, chunk_tokens=512, seed=seed) for seed in seeds]
    bench_case("prefill 512-token chunk (0..511)", prefills, numpy_prefill, max(args.repeats // 10, 10))
    prefill = prefills[0]
    if args.interleave:
        bench_interleaved(make_case(32, context_tokens=192, chunk_tokens=1), args.repeats)
        bench_interleaved(prefill, max(args.repeats // 10, 10))
    if args.baseline:
        bench_against(args.baseline, args.repeats)


if __name__ == "__main__":
    main()
