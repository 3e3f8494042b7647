"""Per-call time of the engine's linear layers: numpy float32 (OpenBLAS), torch bf16 (oneDNN), and ours
(cpu_engine.linear, bf16 with float32 accumulation; where it multiplies with AMX tiles, also its vector
kernel alone, the "ours, no AMX" column).

Shapes are the dev model's (cpu_engine.devckpt): fused qkv, o, fused gate+up, down and the output head,
each at M = 1, 8, 32, 64, 160, 512 rows; then a whole layer stack as the engine runs it: every layer's
four projections with the two residual adds, and the output head on 32 sampled rows.

    python -m bench.linear_bench [--rounds 7] [--block-ms 20] [--no-torch] [--only shapes|stack]
    python -m bench.linear_bench --float32    # numpy against DenseLinear (the engine's float32 layers)

The implementations take turns: each round times a block of calls of each (the median of the block), with
a pause between blocks so the previous one's idle threads have gone to sleep; a figure is the median over
rounds. numpy, torch and the kernel share one OpenMP runtime here (torch's libgomp and ours have the same
name, so the first loaded serves both), under the wait policy in the environment (default: PASSIVE, set
by cpu_engine.linear). GFLOP/s counts 2 * M * K * N.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from cpu_engine import _linear as native
from cpu_engine.config import ModelConfig
from cpu_engine.devckpt import model_config
from cpu_engine.linear import KERNEL_SIMD, KERNEL_TILES, PackedLinear
from cpu_engine.model import DenseLinear

Impl = Callable[[], object]
ROWS = (1, 8, 32, 64, 160, 512)
STACK_ROWS = (32, 64, 160)
SAMPLED_ROWS = 32


def dev_shapes() -> dict[str, tuple[int, int]]:
    """The dev model's linear layers as name -> (K, N)."""
    cfg = ModelConfig.from_dict(model_config())
    h, hd = cfg.hidden_size, cfg.head_dim
    q_dim, kv_dim = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    return {
        "qkv": (h, q_dim + 2 * kv_dim),
        "o": (q_dim, h),
        "gate_up": (h, 2 * cfg.intermediate_size),
        "down": (cfg.intermediate_size, h),
        "lm_head": (h, cfg.vocab_size),
    }


def block_median_s(fn: Impl, num_calls: int) -> float:
    times = []
    for _ in range(num_calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def compare(impls: dict[str, Impl], rounds: int, block_s: float, pause_s: float = 0.005) -> dict[str, float]:
    """Median seconds per call of each implementation, over rounds of blocks taken in turn."""
    num_calls = {}
    for name, fn in impls.items():
        fn()  # warm-up: first touches, thread start
        num_calls[name] = int(np.clip(block_s / max(block_median_s(fn, 3), 1e-7), 5, 500))
    samples: dict[str, list[float]] = {name: [] for name in impls}
    names = list(impls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotate who goes first
            time.sleep(pause_s)
            samples[name].append(block_median_s(impls[name], num_calls[name]))
    return {name: float(np.median(s)) for name, s in samples.items()}


def torch_matmul(torch: Any, x: np.ndarray, w: np.ndarray) -> Impl:
    """bf16 x @ bf16 W the way a torch-based engine would: convert x, multiply, back to float32 numpy."""
    wt = torch.from_numpy(w).to(torch.bfloat16)
    return lambda: torch.matmul(torch.from_numpy(x).to(torch.bfloat16), wt).float().numpy()


def bench_shapes(torch: Any, rounds: int, block_s: float) -> None:
    rng = np.random.default_rng(0)
    no_amx = f" | {'ours, no AMX':>18}" if KERNEL_TILES else ""
    print(f"{'layer':<8} {'K':>5} {'N':>5} {'M':>4} | {'numpy fp32':>18} | {'torch bf16':>18} | "
          f"{'ours bf16':>18}{no_amx} | {'vs numpy':>8} {'vs torch':>8}")  # fmt: skip
    for name, (k, n) in dev_shapes().items():
        w = rng.standard_normal((k, n), dtype=np.float32)
        layer = PackedLinear(w)
        for m in ROWS:
            x = rng.standard_normal((m, k), dtype=np.float32)
            out = np.empty((m, n), dtype=np.float32)
            impls: dict[str, Impl] = {
                "numpy": functools.partial(np.matmul, x, w),
                "ours": functools.partial(layer, x, out),
            }
            if KERNEL_TILES:
                impls["vector"] = functools.partial(native.linear_bf16_vector, out, x, layer.packed, k, n)
            if torch is not None:
                impls["torch"] = torch_matmul(torch, x, w)
            t = compare(impls, rounds, block_s)
            gflop = 2 * m * k * n / 1e9

            def cell(impl: str, t: dict[str, float] = t, gflop: float = gflop) -> str:
                return f"{t[impl] * 1e6:8.1f} us {gflop / t[impl]:5.0f} GF" if impl in t else f"{'-':>18}"

            vs_torch = f"x{t['torch'] / t['ours']:7.2f}" if "torch" in t else f"{'-':>8}"
            ours = cell("ours") + (f" | {cell('vector')}" if KERNEL_TILES else "")
            print(f"{name:<8} {k:>5} {n:>5} {m:>4} | {cell('numpy')} | {cell('torch')} | {ours} | "
                  f"x{t['numpy'] / t['ours']:7.2f} {vs_torch}", flush=True)  # fmt: skip


def bench_float32(rounds: int, block_s: float) -> None:
    """numpy's x @ W against DenseLinear, which sends a few rows to csrc/matmul_f32.c, per dev shape."""
    rng = np.random.default_rng(0)
    print(f"{'layer':<8} {'K':>5} {'N':>5} {'M':>4} | {'numpy fp32 us':>13} | {'DenseLinear us':>14} | "
          "speed-up")  # fmt: skip
    for name, (k, n) in dev_shapes().items():
        w = rng.standard_normal((k, n), dtype=np.float32)
        layer = DenseLinear(w)
        for m in (1, 2, 4, 8, 16, 32, 64):
            x = rng.standard_normal((m, k), dtype=np.float32)
            t = compare({"numpy": functools.partial(np.matmul, x, w), "dense": functools.partial(layer, x)},
                        rounds, block_s)  # fmt: skip
            print(f"{name:<8} {k:>5} {n:>5} {m:>4} | {t['numpy'] * 1e6:13.1f} | {t['dense'] * 1e6:14.1f} | "
                  f"x{t['numpy'] / t['dense']:.2f}", flush=True)  # fmt: skip


def stack_impls(torch: Any, m: int) -> dict[str, Impl]:
    """4 layers x (qkv, o + residual, gate_up, down + residual), then the output head on 32 rows."""
    cfg = ModelConfig.from_dict(model_config())
    shapes = dev_shapes()
    rng = np.random.default_rng(1)
    weights = {name: rng.standard_normal(kn, dtype=np.float32) * 0.05 for name, kn in shapes.items()}
    inputs = {name: rng.standard_normal((m, k), dtype=np.float32) for name, (k, _) in shapes.items()}
    inputs["lm_head"] = inputs["lm_head"][:SAMPLED_ROWS].copy()
    hidden0 = rng.standard_normal((m, cfg.hidden_size), dtype=np.float32)
    layers = cfg.num_hidden_layers
    packed = {name: PackedLinear(w) for name, w in weights.items()}

    def run(mm: Callable[[str], np.ndarray]) -> np.ndarray:
        hidden = hidden0
        for _ in range(layers):
            mm("qkv")
            hidden = hidden + mm("o")
            mm("gate_up")
            hidden = hidden + mm("down")
        return mm("lm_head")

    def fused() -> np.ndarray:
        hidden = hidden0.copy()
        for _ in range(layers):
            packed["qkv"](inputs["qkv"])
            packed["o"](inputs["o"], out=hidden, accumulate=True)
            packed["gate_up"](inputs["gate_up"])
            packed["down"](inputs["down"], out=hidden, accumulate=True)
        return packed["lm_head"](inputs["lm_head"])

    impls: dict[str, Impl] = {
        "numpy": lambda: run(lambda name: inputs[name] @ weights[name]),
        "ours": lambda: run(lambda name: packed[name](inputs[name])),
        "ours, residual fused": fused,
    }
    if torch is not None:
        matmuls = {name: torch_matmul(torch, inputs[name], w) for name, w in weights.items()}
        impls["torch"] = lambda: run(lambda name: matmuls[name]())  # type: ignore[arg-type,return-value]
    return impls


def bench_stack(torch: Any, rounds: int, block_s: float) -> None:
    cfg = ModelConfig.from_dict(model_config())
    print(f"\nlayer stack: {cfg.num_hidden_layers} layers x (qkv, o, gate_up, down) + residual adds, "
          f"lm_head on {SAMPLED_ROWS} rows")  # fmt: skip
    shapes = dev_shapes()
    for m in STACK_ROWS:
        macs = cfg.num_hidden_layers * sum(m * k * n for name, (k, n) in shapes.items() if name != "lm_head")
        macs += SAMPLED_ROWS * shapes["lm_head"][0] * shapes["lm_head"][1]
        t = compare(stack_impls(torch, m), rounds, block_s)
        cells = "  ".join(f"{name} {s * 1e6:7.0f} us ({2 * macs / s / 1e9:3.0f} GF)" for name, s in t.items())
        vs_torch = f", vs torch x{t['torch'] / t['ours']:.2f}" if "torch" in t else ""
        print(f"M={m:<4} {cells}  | ours vs numpy x{t['numpy'] / t['ours']:.2f}{vs_torch}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-ms", type=float, default=20.0, help="time per block of calls")
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--only", choices=["shapes", "stack"], help="run one of the two parts")
    parser.add_argument("--float32", action="store_true", help="numpy against DenseLinear only")
    args = parser.parse_args()
    if args.float32:
        threads = os.environ.get("OMP_NUM_THREADS")
        print(f"{os.cpu_count()} CPUs; OMP_NUM_THREADS={threads}; numpy {np.__version__}")
        bench_float32(args.rounds, args.block_ms / 1e3)
        return
    torch: Any = None
    if not args.no_torch:
        try:  # NOTE: after cpu_engine.linear, so torch shares the OpenMP runtime under the same policy
            torch = importlib.import_module("torch")
        except ImportError:
            print("(torch is not installed: no torch column)")
    if torch is not None:
        torch.set_num_threads(os.cpu_count() or 1)
    print(
        f"kernel: {KERNEL_SIMD}{' + ' + KERNEL_TILES if KERNEL_TILES else ''}, tile {native.TILE_N} columns; "
        f"{os.cpu_count()} CPUs; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, "
        f"GOMP_SPINCOUNT={os.environ.get('GOMP_SPINCOUNT')}; "
        f"starting a parallel region costs {native.openmp_wake_us:.1f} us; "
        f"torch {torch.__version__ if torch is not None else '-'}, numpy {np.__version__}"
    )
    if args.only != "stack":
        bench_shapes(torch, args.rounds, args.block_ms / 1e3)
    if args.only != "shapes":
        bench_stack(torch, args.rounds, args.block_ms / 1e3)


if __name__ == "__main__":
    main()
