"""CPU engine alone (no server): throughput, TTFT and inter-token latency at several concurrencies.

Closed loop: C requests in flight, a new one starts when one finishes; each has a distinct random
128-token prompt (no prefix-cache hits) and generates exactly 128 tokens (ignore_eos). The engine is
stepped in this process's main thread, so the numbers are the engine's own.

    .venv/bin/python -m bench.engine_bench --model .sluice/models/sluice-tiny --write-docs
    .venv/bin/python -m bench.engine_bench --concurrency 1 32 --dtype auto bfloat16 float32

``--dtype auto`` runs what the engine picks on this CPU (see cpu_engine/cpu_features.py); the CPU, the
flags that choice was based on and the choice itself are printed above the table.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from bench.cpu_split import self_cpu_s
from bench.report import cpu_description, pct, write_section
from cpu_engine.config import DTYPE_SETTINGS, DTypeSetting, EngineConfig
from cpu_engine.cpu_features import detect_dtype
from cpu_engine.engine import LLMEngine
from cpu_engine.native import elementwise_ext
from cpu_engine.sampling import SamplingParams
from replicas.render import optional_float


@dataclass
class Timeline:
    added_s: float
    token_times_s: list[float] = field(default_factory=list)


@dataclass
class Result:
    concurrency: int
    num_requests: int
    output_tokens_per_s: float
    ttft_ms: list[float]
    itl_ms: list[float]
    num_preemptions: int
    median_step_ms: float
    cpu_s: float = 0.0  # this process's CPU (every thread) over the timed run, model loading excluded
    elapsed_s: float = 0.0
    output_tokens: int = 0


@contextmanager
def engine_threads(num_threads: int | None) -> Iterator[None]:
    """The engine's threads when ``run`` is called in this thread, set to ``num_threads`` for the block and
    put back after it: the calling thread's OpenMP team (the kernels) and numpy's BLAS pool (the float32
    layers' one-row and prefill products, ``cpu_engine.model.DenseLinear``). A replica gets both from its
    OMP_NUM_THREADS (``replicas.launcher.engine_team``; OpenBLAS reads it when OPENBLAS_NUM_THREADS is
    unset). None leaves them as they are (by default every core)."""
    if num_threads is None:
        yield
        return
    team_before = elementwise_ext.get_max_threads()
    elementwise_ext.set_num_threads(num_threads)
    try:
        with threadpool_limits(limits=num_threads, user_api="blas"):
            yield
    finally:
        elementwise_ext.set_num_threads(team_before)


def run(
    model: str,
    concurrency: int,
    num_requests: int,
    prompt_len: int,
    output_len: int,
    budget: int,
    seed: int,
    dtype: DTypeSetting,
    prefill_step_stretch: float | None = EngineConfig.prefill_step_stretch,
    prefill_num_threads: int | None = None,
    kv_cache_dtype: DTypeSetting = "auto",
) -> Result:
    cfg = EngineConfig(
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        num_kv_blocks=max(1024, concurrency * (prompt_len + output_len) // 16 + 64),
        step_token_budget=budget,
        max_num_running=max(concurrency, 1),
        prefill_step_stretch=prefill_step_stretch,
        prefill_num_threads=prefill_num_threads,
    )
    engine = LLMEngine.from_checkpoint(model, cfg)
    rng = np.random.default_rng(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    # Warm-up: touch every code path once so first-call costs are not measured.
    engine.add_request("warmup", rng.integers(0, vocab, prompt_len).tolist(), SamplingParams(max_tokens=4))
    while engine.has_unfinished():
        engine.step()
    timelines: dict[str, Timeline] = {}
    num_started = 0

    def start_one() -> None:
        nonlocal num_started
        rid = f"r{num_started}"
        timelines[rid] = Timeline(time.perf_counter())
        engine.add_request(rid, rng.integers(0, vocab, prompt_len).tolist(), params)
        num_started += 1

    began, cpu_began = time.perf_counter(), self_cpu_s()
    for _ in range(min(concurrency, num_requests)):
        start_one()
    step_ms: list[float] = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        step_ms.append((now - t0) * 1000)
        for out in outputs:
            timelines[out.request_id].token_times_s.extend([now] * len(out.new_token_ids))
            if out.finished and num_started < num_requests:
                start_one()
    elapsed, cpu_s = time.perf_counter() - began, self_cpu_s() - cpu_began
    ttft = [(t.token_times_s[0] - t.added_s) * 1000 for t in timelines.values()]
    itl = [float(d) * 1000 for t in timelines.values() for d in np.diff(t.token_times_s)]
    total = sum(len(t.token_times_s) for t in timelines.values())
    return Result(
        concurrency,
        num_requests,
        total / elapsed,
        ttft,
        itl,
        engine.stats().num_preemptions_total,
        float(np.median(step_ms)),
        cpu_s,
        elapsed,
        total,
    )


def machine_line() -> str:
    """The CPU, the flags the dtype choice reads, the bf16 kernel's build and what ``--dtype auto`` picks."""
    choice = detect_dtype("auto")
    return (
        f"CPU: {cpu_description()}; flags: {choice.cpu_flags_label}; bf16 kernel: {choice.bf16_kernel}; "
        f"--dtype auto chooses {choice.dtype} ({choice.reason}), its KV cache {choice.kv_cache_dtype}."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".sluice/models/sluice-tiny")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--requests-per-slot", type=int, default=4, help="requests = this x concurrency (min 8)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--step-token-budget", type=int, default=EngineConfig.step_token_budget)
    ap.add_argument(
        "--prefill-step-stretch",
        type=optional_float,
        default=EngineConfig.prefill_step_stretch,
        help="a step with prefill takes at most about this many decode-only steps ('none': no limit)",
    )
    ap.add_argument(
        "--prefill-num-threads",
        type=int,
        default=None,
        help="OpenMP threads for a step with prefill (EngineConfig.prefill_num_threads; default: the team)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    ap.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=DTYPE_SETTINGS)
    ap.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=DTYPE_SETTINGS,
        help="the KV cache's (auto: bfloat16, unless --dtype is float32)",
    )
    args = ap.parse_args()
    machine = machine_line()
    print(machine)
    print(
        f"step token budget {args.step_token_budget}, prefill step stretch {args.prefill_step_stretch}, "
        f"prefill threads {args.prefill_num_threads or 'the team'}"
    )
    header = (
        "| dtype (linear, KV cache) | concurrency | requests | output tok/s | TTFT p50 ms | TTFT p95 ms "
        "| ITL p50 ms | ITL p95 ms | step p50 ms | preemptions |"
    )
    print(header)
    print("|" + "---|" * 10)
    rows, gains = [], []
    for dtype in args.dtype:
        choice = detect_dtype(dtype, args.kv_cache_dtype)
        label = f"{dtype if dtype != 'auto' else f'auto: {choice.dtype}'}, KV {choice.kv_cache_dtype}"
        results = {}
        for c in args.concurrency:
            num_requests = max(8, args.requests_per_slot * c)
            r = run(
                args.model,
                c,
                num_requests,
                args.prompt_len,
                args.output_len,
                args.step_token_budget,
                args.seed + c,
                dtype,
                args.prefill_step_stretch,
                args.prefill_num_threads,
                args.kv_cache_dtype,
            )
            results[c] = r
            row = (
                f"| {label} | {c} | {r.num_requests} | {r.output_tokens_per_s:,.0f} | "
                f"{pct(r.ttft_ms, 50):.1f} | "
                f"{pct(r.ttft_ms, 95):.1f} | {pct(r.itl_ms, 50):.2f} | {pct(r.itl_ms, 95):.2f} | "
                f"{r.median_step_ms:.2f} | {r.num_preemptions} |"
            )
            rows.append(row)
            print(row, flush=True)
        if 1 in results and 32 in results:
            g = results[32].output_tokens_per_s / results[1].output_tokens_per_s
            gains.append(f"- {label}: batching gain (tok/s at 32 / tok/s at 1) **{g:.1f}x**")
            print(gains[-1])
    if args.write_docs:
        body = "\n".join(
            [
                f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()} ({os.cpu_count()} cores); "
                f"{args.prompt_len} prompt + {args.output_len} output tokens (ignore_eos), greedy, "
                f"step token budget {args.step_token_budget}, prefill step stretch "
                f"{args.prefill_step_stretch}.",
                "",
                machine,
                "",
                "```",
                "make bench-engine   # = .venv/bin/python -m bench.engine_bench --write-docs",
                "```",
                "",
                header,
                "|" + "---|" * 10,
                *rows,
                "",
                *gains,
            ]
        )
        write_section("engine", body)


if __name__ == "__main__":
    main()
