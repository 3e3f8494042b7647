"""The same load through `make run`'s stack over two (or more) model repositories, alternating: what one
replica knob is worth end to end.

Each round starts the stack (gateway + tritonserver + CPU engine, the dev checkpoint) on each repository
in turn, runs one closed-loop load through it (bench/e2e_bench.run_load: C streams, distinct random
prompts, ignore_eos), and stops it; the prompts of a round are the same for every repository. Render
the variants with `python -m replicas.render`, e.g. the engine's step-time bound at the rendered
default, at the whole inter-token target, and off:

    .venv/bin/python -m replicas.render --out /tmp/repo-off \\
        --checkpoint-dir .sluice/models/sluice-tiny --model-name sluice-tiny --target-step-ms none
    .venv/bin/python -m bench.stack_ab --concurrency 16 32 --rounds 3 \\
        default=.sluice/model_repository off=/tmp/repo-off

A variant may also change the stack's settings (`--env NAME:SLUICE_KEY=VALUE`, repeatable; also
`OMP_NUM_THREADS`, the engine's threads), e.g. the inter-token headroom over the same repository:

    .venv/bin/python -m bench.stack_ab --concurrency 64 \\
        default=.sluice/model_repository narrow=.sluice/model_repository \\
        --env narrow:SLUICE_ITL_HEADROOM_FRACTION=0.075

Stop `make run` first: each stack takes its ports. Prints one line per run and, per concurrency and
variant, the medians over the rounds. The tenant is bench-none (safety policy none, no token budget or
concurrency cap), as in bench.goodput.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from bench.cpu_split import CpuMeter, CpuSplit
from bench.e2e_bench import Summary, run_load
from bench.e2e_side_by_side import NONE_API_KEY
from bench.engine_bench import machine_line
from bench.goodput import goodput_tenants
from bench.report import load_average, pct
from bench.servers import SluiceStack

GATEWAY_URL = "http://127.0.0.1:8080"  # make run's gateway
MODEL = "sluice-tiny"


@dataclass(frozen=True)
class Variant:
    name: str
    repository: Path
    env: dict[str, str] = field(default_factory=dict)  # the stack's settings for this variant


@dataclass(frozen=True)
class RunFigures:
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    # TTFT p95 of the requests after the first wave (the first `concurrency` sent, all at once at the start:
    # with long prompts they queue behind each other's prefill, which a steady load does not).
    later_ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    later_itl_p95_ms: float  # ITL p95 of the requests after the first wave
    tokens_per_chunk: float  # what a text chunk carries: how the replica's send path coalesces tokens
    # CPU per output token (issue 22, item 4): the serving path (gateway + tritonserver + the engine model's
    # threads other than the engine's), the engine's threads, and every process (the client included).
    serving_path_us: float
    engine_us: float
    all_us: float

    @classmethod
    def of(cls, summary: Summary, cpu: CpuSplit) -> RunFigures:
        return cls(
            summary.output_tokens / summary.elapsed_s,
            pct(summary.ttft_ms, 50),
            pct(summary.ttft_ms, 95),
            pct(summary.later_ttft_ms, 95),
            pct(summary.itl_ms, 50),
            pct(summary.itl_ms, 95),
            pct(summary.later_itl_ms, 95),
            summary.output_tokens / max(summary.num_chunks, 1),
            cpu.serving_path_us_per_token,
            cpu.engine_threads_us_per_token,
            cpu.total_us_per_token,
        )

    def line(self) -> str:
        return (
            f"{self.tokens_per_s:,.0f} tok/s, TTFT p50/p95 {self.ttft_p50_ms:.0f}/{self.ttft_p95_ms:.0f} ms "
            f"(after the first wave p95 {self.later_ttft_p95_ms:.0f}), "
            f"ITL p50/p95 {self.itl_p50_ms:.1f}/{self.itl_p95_ms:.1f} ms "
            f"(after the first wave p95 {self.later_itl_p95_ms:.1f}), "
            f"{self.tokens_per_chunk:.2f} tokens a chunk; CPU per token: serving path "
            f"{self.serving_path_us:.0f} µs, engine threads {self.engine_us:.0f}, all {self.all_us:.0f}"
        )


def parse_variant(text: str) -> Variant:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=MODEL_REPOSITORY, got {text!r}")
    repository = Path(path)
    if not (repository / MODEL / "config.pbtxt").is_file():
        raise argparse.ArgumentTypeError(f"{repository} holds no {MODEL}/config.pbtxt (render it first)")
    return Variant(name, repository)


# Besides SLUICE_ settings, what a variant may set: the engine's OpenMP threads (the launcher's default is
# one fewer than the cores; an OMP_NUM_THREADS in the stack's environment wins, replicas.launcher), how
# they wait between parallel regions (spinning takes cores the serving path shares), and numpy's BLAS pool.
OTHER_KEYS = frozenset({"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_NUM_THREADS"})


def parse_env(text: str) -> tuple[str, str, str]:
    """``NAME:KEY=VALUE`` -> (variant name, key, value); the key a SLUICE_ setting or one of OTHER_KEYS."""
    name, sep, setting = text.partition(":")
    key, eq, value = setting.partition("=")
    if not sep or not name or not eq or not (key.startswith("SLUICE_") or key in OTHER_KEYS):
        raise argparse.ArgumentTypeError(
            f"expected NAME:SLUICE_KEY=VALUE (or one of {', '.join(sorted(OTHER_KEYS))}), got {text!r}"
        )
    return name, key, value


def with_env(variants: list[Variant], settings: list[tuple[str, str, str]]) -> list[Variant]:
    """``variants`` with each ``--env`` setting added to the variant it names (a name none has: an error)."""
    by_name = {v.name: replace(v, env=dict(v.env)) for v in variants}
    if len(by_name) < len(variants):
        raise SystemExit("two variants share a name")
    for name, key, value in settings:
        if name not in by_name:
            raise SystemExit(f"--env {name}:{key}: no variant is named {name!r}")
        by_name[name].env[key] = value
    return [by_name[v.name] for v in variants]


def run_once(variant: Variant, args: argparse.Namespace, concurrency: int, seed: int) -> RunFigures:
    log_path = Path(f".sluice/bench/stack_ab/{variant.name}.log")
    stack = SluiceStack(variant.repository, GATEWAY_URL, log_path, env=variant.env)
    for tenant, key in goodput_tenants():
        stack.put_tenant(tenant, key)
    try:
        stack.start()
        root = stack.root
        assert root is not None  # started
        meter = CpuMeter({variant.name: root})
        meter.start()
        summary = asyncio.run(
            run_load(
                f"{GATEWAY_URL}/v1",
                NONE_API_KEY,
                MODEL,
                concurrency,
                concurrency * args.requests_per_stream,
                args.prompt_len,
                args.output_len,
                args.vocab,
                seed,
                variant.name,
            )
        )
        cpu = meter.stop(summary.output_tokens, summary.num_chunks)
    finally:
        stack.stop()
    return RunFigures.of(summary, cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("variants", nargs="+", type=parse_variant, help="NAME=MODEL_REPOSITORY")
    ap.add_argument(
        "--env", type=parse_env, action="append", default=[], metavar="NAME:SLUICE_KEY=VALUE",
        help="a setting of the stack for one variant (repeatable)",
    )  # fmt: skip
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests-per-stream", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192, help="prompt ids are drawn from 3..vocab")
    args = ap.parse_args()
    args.variants = with_env(args.variants, args.env)
    print(machine_line())
    print(f"{load_average()} before the run")
    for variant in args.variants:
        if variant.env:
            print(f"{variant.name}: {' '.join(f'{k}={v}' for k, v in sorted(variant.env.items()))}")
    figures: dict[tuple[int, str], list[RunFigures]] = {}
    for concurrency in args.concurrency:
        for round_index in range(args.rounds):
            for variant in args.variants:
                run = run_once(variant, args, concurrency, seed=1_000 * round_index + concurrency)
                figures.setdefault((concurrency, variant.name), []).append(run)
                label = f"{concurrency} streams, round {round_index + 1}, {variant.name}"
                print(f"{label}: {run.line()}", flush=True)
    print(
        "\n| streams | variant | tok/s | TTFT p50 | TTFT p95 | TTFT p95 after wave 1 | ITL p50 | ITL p95 "
        "| ITL p95 after wave 1 | tokens a chunk | serving path µs/token | engine threads µs/token "
        "| all µs/token |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (concurrency, variant_name), runs in figures.items():
        med = {k: float(np.median([getattr(r, k) for r in runs])) for k in RunFigures.__annotations__}
        print(
            f"| {concurrency} | {variant_name} | {med['tokens_per_s']:,.0f} | {med['ttft_p50_ms']:.0f} | "
            f"{med['ttft_p95_ms']:.0f} | {med['later_ttft_p95_ms']:.0f} | "
            f"{med['itl_p50_ms']:.1f} | {med['itl_p95_ms']:.1f} | {med['later_itl_p95_ms']:.1f} | "
            f"{med['tokens_per_chunk']:.2f} | {med['serving_path_us']:.0f} | {med['engine_us']:.0f} | "
            f"{med['all_us']:.0f} |"
        )
    print(f"(medians of {args.rounds} rounds, ms; {load_average()} after the run)")


if __name__ == "__main__":
    main()
