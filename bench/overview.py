"""The overview at the top of docs/benchmarks.md that ``make bench`` (bench/all.py) writes: the machine and
the command, every benchmark's last run (status, minutes), and each plot with a one-line reading.

A reading is computed from the numbers saved beside the plot (``<plot>.json``), so it always says what the
picture shows; a plot not drawn yet is listed as such. Runs are remembered in docs/img/bench-runs.json, so
``--only NAME`` updates one row and keeps the others' last results.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.goodput_core import CONCURRENCY, Point, Slo, goodput, median_points
from bench.report import DOCS, cpu_description, cpu_flags, pct

SECTION = "overview"
Reader = Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class RunRecord:
    """One benchmark's last run, as the overview's table shows it."""

    name: str
    status: str  # "ok", "failed (exit status N)", "skipped: why"
    minutes: float
    finished: str  # date and time, UTC


def load_runs(path: Path) -> dict[str, RunRecord]:
    if not path.exists():
        return {}
    return {name: RunRecord(**record) for name, record in json.loads(path.read_text()).items()}


def save_runs(path: Path, runs: Mapping[str, RunRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({name: asdict(r) for name, r in sorted(runs.items())}, indent=1) + "\n")


# ----- one-line readings of the plots, from their JSON -----
def read_cancel(data: Mapping[str, Any]) -> str:
    samples = data["samples"]
    done = [max(s["requests_freed_ms"], s["kv_freed_ms"]) for s in samples
            if s["requests_freed_ms"] is not None and s["kv_freed_ms"] is not None]  # fmt: skip
    return (
        f"a closed stream's request and KV blocks are freed on the replica {pct(done, 50):.0f} ms after the "
        f"client closes it (p95 {pct(done, 95):.0f} ms, max {max(done, default=float('nan')):.0f} ms, "
        f"{len(done)} of {len(samples)} streams freed)"
    )


def read_sweep(data: Mapping[str, Any]) -> str:
    runs = data["runs"]
    top = max(int(r["concurrency"]) for r in runs)

    def median(target: str, field: str) -> float:
        values = [float(r[field]) for r in runs if r["target"] == target and r["concurrency"] == top]
        return statistics.median(values) if values else float("nan")

    sluice_tps = median("sluice", "tokens_per_s")
    shares = [
        f"{label} {sluice_tps / engine_tps:.0%}"
        for label, target in (("on every core", "engine"), ("on the replica's threads", "engine-team"))
        if (engine_tps := median(target, "tokens_per_s")) > 0
    ]
    share = f"; the stack's share of the engine alone {', '.join(shares)}" if shares else ""
    return (
        f"{'on ' + data['cpu'] + ': ' if 'cpu' in data else ''}"
        f"at {top} streams Sluice's TTFT p95 is {median('sluice', 'ttft_p95_ms'):.0f} ms against vLLM's "
        f"{median('vllm', 'ttft_p95_ms'):.0f} ms, inter-token p95 {median('sluice', 'itl_p95_ms'):.1f} ms "
        f"against {median('vllm', 'itl_p95_ms'):.1f} ms, {sluice_tps:,.0f} output "
        f"tok/s against {median('vllm', 'tokens_per_s'):,.0f}{share}; {data.get('load', 'load not recorded')}"
    )


def read_goodput(data: Mapping[str, Any]) -> str:
    """Issue 22's headline from the goodput bench's concurrency sweep: each server's goodput (the most
    tok/s at a point within the SLO) and the two at the most streams swept."""
    points = median_points([Point(**run) for run in data["runs"]])
    slo = Slo(**data["slo"])
    best = {t: goodput(points, t, slo) for t in ("sluice", "vllm")}
    if best["sluice"] is None or best["vllm"] is None:
        ratio = "no ratio: a server met the SLO at no point"
    else:
        ratio = f"{best['sluice'].tokens_per_s / best['vllm'].tokens_per_s:.2f}x"

    def at(point: Point | None) -> str:
        return (
            "none within it"
            if point is None
            else f"{point.tokens_per_s:,.0f} tok/s at {point.load:g} streams"
        )

    top = max(p.load for p in points if p.sweep == CONCURRENCY)
    most = {p.target: p for p in points if p.sweep == CONCURRENCY and p.load == top}
    sluice, vllm = most.get("sluice"), most.get("vllm")
    at_top = (
        f"; at {top:g} streams {sluice.tokens_per_s:,.0f} against {vllm.tokens_per_s:,.0f} tok/s, ITL p95 "
        f"{sluice.itl_p95_ms:.1f} against {vllm.itl_p95_ms:.1f} ms"
        if sluice is not None and vllm is not None
        else ""
    )
    return (
        f"on {data.get('cpu', 'a CPU not recorded')}, closed-loop streams, within {slo.text()}: Sluice "
        f"{at(best['sluice'])} against vLLM's {at(best['vllm'])} ({ratio}){at_top}; "
        f"{data.get('load', 'load not recorded')}"
    )


def read_noisy(data: Mapping[str, Any]) -> str:
    unloaded, flooded = data["phases"]["unloaded"], data["phases"]["during the flood"]
    quiet, flooder = list(flooded["tokens_per_s"])
    share = flooded["tokens_per_s"][quiet] / (sum(flooded["tokens_per_s"].values()) or 1)
    streams = data.get("num_streams", {})
    against = f" (its {streams[quiet]} streams against {streams[flooder]})" if streams else ""
    return (
        f"the quiet tenant's TTFT p95 goes from {pct(unloaded['ttft_ms'], 95):.0f} ms alone to "
        f"{pct(flooded['ttft_ms'], 95):.0f} ms while {flooder} floods (target {data['ttft_bound_ms']:.0f} "
        f"ms); it gets {share:.0%} of the output tokens during the flood{against}"
    )


def read_sim(data: Mapping[str, Any]) -> str:
    """A scenario's targets met, and each fleet run's figures: one run's at the top level of its summary,
    several runs' (e.g. noisy-tenant's wfq-baseline, wfq-noisy, fcfs-noisy) each under its name."""
    checks = data.get("targets", {}).get("checks", [])
    runs = (
        {"": data}
        if "ttft_p95_ms" in data
        else {name: row for name, row in data.items() if isinstance(row, dict) and "ttft_p95_ms" in row}
    )
    rows = [f"{f'{name}: ' if name else ''}TTFT p95 {row['ttft_p95_ms']:,.0f} ms, utilisation "
            f"{row['utilisation']:.0%}, shed {row['shed_rate']:.1%}"
            for name, row in runs.items()]  # fmt: skip
    missed = [c["target"] for c in checks if not c["met"]]
    met = f"{len(checks) - len(missed)} of {len(checks)} targets met"
    return f"{data.get('replicas', '?')} replicas, {met}{f' (not: {missed[0]})' if missed else ''}; " + (
        "; ".join(rows)
    )


@dataclass(frozen=True)
class Plot:
    path: str  # under docs/
    title: str
    reader: Reader


# The plots every overview lists, drawn or not yet.
PLOTS = (
    Plot("img/noisy-tenant.png", "Fairness under a noisy tenant", read_noisy),
    Plot("img/cancel-to-free.png", "Cancel-to-free latency", read_cancel),
    *(
        Plot(f"img/sim/{scenario}.png", f"Simulator: {scenario}", read_sim)
        for scenario in ("steady", "doubling", "noisy-tenant", "batch-fill")
    ),
)


def per_cpu_plots(docs_dir: Path) -> list[Plot]:
    """The plots drawn once per kind of CPU (bench.goodput's and bench.e2e_side_by_side's sections are one
    per CPU, each with its plot and numbers), found on disk: issue 22's goodput headline first, 128/128
    before the seed's mix, then the end-to-end sweeps. A reading names its CPU."""
    img = docs_dir / "img"
    found = sorted(img.glob("goodput-*concurrency.png"), key=lambda p: ("seed-mix" in p.name, p.name))
    headline = "Goodput beside vLLM (issue 22's headline)"
    seed_mix = ", the seed's mix (1,000-token prompts, 300 out)"
    goodput = [
        Plot(str(png.relative_to(docs_dir)), headline + (seed_mix if "seed-mix" in png.name else ", 128/128"),
             read_goodput)
        for png in found
    ] or [Plot("img/goodput-concurrency.png", headline, read_goodput)]  # fmt: skip
    title = "Beside vLLM and the engine alone (`make bench-e2e`)"
    sweeps = [
        Plot(str(png.relative_to(docs_dir)), title, read_sweep)
        for png in sorted(img.glob("e2e-vs-vllm-*.png"))
    ]
    sweeps = sweeps or [Plot("img/e2e-vs-vllm.png", title, read_sweep)]
    return goodput + sweeps


def plot_lines(docs_dir: Path, plots: Sequence[Plot] | None = None) -> list[str]:
    """Each plot's one-line reading and the plot; ``plots`` default: every per-CPU plot on disk, then
    ``PLOTS``."""
    lines: list[str] = []
    for plot in (per_cpu_plots(docs_dir) + list(PLOTS)) if plots is None else plots:
        png, numbers = docs_dir / plot.path, (docs_dir / plot.path).with_suffix(".json")
        if not png.exists() or not numbers.exists():
            lines += [f"**{plot.title}**: not drawn yet.", ""]
            continue
        try:
            reading = plot.reader(json.loads(numbers.read_text()))
        except (KeyError, ValueError, TypeError) as exc:
            reading = f"(no reading: {plot.path} has unexpected numbers: {exc!r})"
        lines += [f"**{plot.title}**: {reading}.", "", f"![{plot.title}]({plot.path})", ""]
    return lines


def overview(
    runs: Mapping[str, RunRecord], names: Sequence[str], command: str, load: str, docs_dir: Path
) -> str:
    """The overview section's body: the machine, the command, each benchmark's last run, the plots."""
    table = ["| benchmark | last run (UTC) | status | minutes |", "|---|---|---|---:|"]
    for name in names:
        r = runs.get(name)
        table.append(
            f"| {name} | - | not run yet | - |"
            if r is None
            else f"| {name} | {r.finished} | {r.status} | {r.minutes:.1f} |"
        )
    return "\n".join(
        [
            "## Overview (`make bench`)",
            "",
            f"Written {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC by `{command}` on "
            f"{cpu_description()} (flags: {cpu_flags()}); {load}. These cores are shared with other work, "
            "so absolute figures move from run to run: compare within a table, where runs alternate. "
            "`BENCH_QUICK=1 make bench` runs reduced sizes and writes nothing here (a smoke run); "
            "`make bench BENCH_ONLY=NAME` runs one benchmark.",
            "",
            *table,
            "",
            *plot_lines(docs_dir),
        ]
    )


def write_overview(body: str, docs: Path = DOCS) -> None:
    """Replace the overview section, or insert it at the top: after the title's introduction, before the
    first ``##`` heading or section marker."""
    block = f"<!-- BEGIN {SECTION} -->\n{body.rstrip()}\n<!-- END {SECTION} -->"
    text = docs.read_text() if docs.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- BEGIN {SECTION} -->.*?<!-- END {SECTION} -->", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        first = re.search(r"^(## |<!-- BEGIN )", text, re.M)
        at = first.start() if first else len(text)
        text = text[:at].rstrip() + "\n\n" + block + "\n\n" + text[at:].lstrip()
    docs.write_text(text.rstrip() + "\n")
