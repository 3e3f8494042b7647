"""The pure parts of the goodput benchmark (bench/goodput.py): the open-loop arrival schedule, a run's
figures and their medians over rounds, which points meet the latency SLO, goodput, the check that
throughput does not fall as streams are added, the issue's targets and the tables. No servers, no I/O.

A *point* is one load of one sweep against one target: a number of closed-loop streams (``concurrency``
sweep) or an offered request rate of Poisson arrivals (``rate`` sweep). Each run at a point is reduced to
a ``Point`` of a few figures; over several rounds a point's figures are the medians of its runs'.

Goodput is the most output tokens/s over the points (both sweeps) where the target met the SLO: TTFT p95
and ITL p95 within their bounds, and every request of every run served (a point where some request was
refused or failed does not count, however fast the rest were: shedding load is not meeting it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from bench.report import pct
from bench.side_by_side import SLUICE, SLUICE_DEFAULT, TARGET_LABELS, VLLM

CONCURRENCY, RATE = "concurrency", "rate"
# The figures a point's median is taken of: (attribute of Point, column label, decimals shown).
METRICS: tuple[tuple[str, str, int], ...] = (
    ("tokens_per_s", "tok/s", 0),
    ("ttft_p50_ms", "TTFT p50", 1),
    ("ttft_p95_ms", "TTFT p95", 1),
    ("ttft_p99_ms", "TTFT p99", 1),
    ("itl_p50_ms", "ITL p50", 2),
    ("itl_p95_ms", "ITL p95", 2),
    ("itl_p99_ms", "ITL p99", 2),
    ("tpot_p50_ms", "TPOT p50", 2),
    ("tpot_p95_ms", "TPOT p95", 2),
)
# Every figure of a Point that a median is taken of: the metrics, and the client's lateness.
FIGURES = (*(name for name, _, _ in METRICS), "late_p95_ms")
TARGET_ORDER = (SLUICE, SLUICE_DEFAULT, VLLM)


def arrival_schedule(rate_per_s: float, duration_s: float, max_requests: int, seed: int) -> list[float]:
    """Poisson arrivals at ``rate_per_s``: each request's send time in seconds from the start of the run
    (exponential gaps), those within ``duration_s``, at most ``max_requests``. The same seed gives the
    same schedule, so every target of a round is offered the very same load."""
    if not rate_per_s > 0 or not duration_s > 0 or max_requests < 1:
        raise ValueError(
            f"rate, duration and max requests must be positive: {rate_per_s}, {duration_s}, {max_requests}"
        )
    rng = np.random.default_rng([seed, 0x6F70656E])  # a stream apart from the prompts' (seeded by seed)
    times: list[float] = []
    t = float(rng.exponential(1.0 / rate_per_s))
    while t <= duration_s and len(times) < max_requests:
        times.append(t)
        t += float(rng.exponential(1.0 / rate_per_s))
    return times


@dataclass(frozen=True)
class Point:
    """One run's figures at one point (or, as ``median_of`` makes it, the medians over its runs:
    ``round_index`` -1, ``requests`` and ``errors`` summed). Latencies in ms, NaN where not measured."""

    target: str
    sweep: str  # CONCURRENCY or RATE
    load: float  # concurrent streams, or offered requests per second
    round_index: int
    requests: int  # served to the end
    errors: int  # refused or failed (any HTTP status but 200, an error in the stream)
    tokens_per_s: float  # output tokens (from usage) over the run's wall time
    ttft_p50_ms: float = math.nan
    ttft_p95_ms: float = math.nan
    ttft_p99_ms: float = math.nan
    itl_p50_ms: float = math.nan
    itl_p95_ms: float = math.nan
    itl_p99_ms: float = math.nan
    tpot_p50_ms: float = math.nan
    tpot_p95_ms: float = math.nan
    late_p95_ms: float = math.nan  # open loop: how late the client sent, against the schedule (p95)

    @classmethod
    def from_samples(
        cls,
        target: str,
        sweep: str,
        load: float,
        round_index: int,
        requests: int,
        errors: int,
        tokens_per_s: float,
        ttft_ms: Sequence[float],
        itl_ms: Sequence[float],
        tpot_ms: Sequence[float],
        late_ms: Sequence[float] = (),
    ) -> Point:
        ttft, itl, tpot, late = list(ttft_ms), list(itl_ms), list(tpot_ms), list(late_ms)
        return cls(
            target, sweep, load, round_index, requests, errors, tokens_per_s,
            pct(ttft, 50), pct(ttft, 95), pct(ttft, 99),
            pct(itl, 50), pct(itl, 95), pct(itl, 99),
            pct(tpot, 50), pct(tpot, 95), pct(late, 95),
        )  # fmt: skip

    @classmethod
    def failed(cls, target: str, sweep: str, load: float, round_index: int) -> Point:
        """A run that ended in an error before it could be measured."""
        return cls(target, sweep, load, round_index, 0, 1, math.nan)

    @staticmethod
    def median_of(runs: Sequence[Point]) -> Point:
        """The point's figures over its runs: each metric's median over the runs that measured it."""
        if not runs or len({(r.target, r.sweep, r.load) for r in runs}) != 1:
            raise ValueError("median_of needs the runs of one target at one point")
        medians: dict[str, float] = {}
        for name in FIGURES:
            values = [v for v in (getattr(r, name) for r in runs) if not math.isnan(v)]
            medians[name] = statistics.median(values) if values else math.nan
        first = runs[0]
        return Point(
            first.target,
            first.sweep,
            first.load,
            -1,
            sum(r.requests for r in runs),
            sum(r.errors for r in runs),
            **medians,
        )

    def load_text(self) -> str:
        return f"{self.load:g} streams" if self.sweep == CONCURRENCY else f"{self.load:g} req/s"

    def line(self) -> str:
        """A one-line progress report."""
        late = f", sent late p95 {self.late_p95_ms:.1f} ms" if not math.isnan(self.late_p95_ms) else ""
        return (
            f"{self.target:<14} {self.load_text():>11} round {self.round_index + 1}: {self.requests} served, "
            f"{self.errors} errors, {self.tokens_per_s:,.0f} tok/s, TTFT p50/p95/p99 {self.ttft_p50_ms:.1f}/"
            f"{self.ttft_p95_ms:.1f}/{self.ttft_p99_ms:.1f} ms, ITL p50/p95/p99 {self.itl_p50_ms:.1f}/"
            f"{self.itl_p95_ms:.1f}/{self.itl_p99_ms:.1f} ms, TPOT p50/p95 {self.tpot_p50_ms:.2f}/"
            f"{self.tpot_p95_ms:.2f} ms{late}"
        )


def median_points(runs: Sequence[Point]) -> list[Point]:
    """One median point per (target, sweep, load) that has runs, in the order they first ran."""
    keys: list[tuple[str, str, float]] = []
    for r in runs:
        if (key := (r.target, r.sweep, r.load)) not in keys:
            keys.append(key)
    return [Point.median_of([r for r in runs if (r.target, r.sweep, r.load) == key]) for key in keys]


@dataclass(frozen=True)
class Slo:
    """The latency SLO a point must meet to count towards goodput."""

    ttft_p95_ms: float = 500.0
    itl_p95_ms: float = 40.0

    def met_by(self, point: Point) -> bool:
        """TTFT p95 and ITL p95 within bounds (NaN is not), and no request refused or failed."""
        return (
            point.errors == 0
            and point.requests > 0
            and point.ttft_p95_ms <= self.ttft_p95_ms
            and point.itl_p95_ms <= self.itl_p95_ms
        )

    def text(self) -> str:
        return f"TTFT p95 <= {self.ttft_p95_ms:g} ms and ITL p95 <= {self.itl_p95_ms:g} ms"


def goodput(points: Sequence[Point], target: str, slo: Slo) -> Point | None:
    """The point of ``target`` (either sweep) with the most output tokens/s among those meeting ``slo``
    (None if none does): goodput is its tokens/s."""
    eligible = [p for p in points if p.target == target and slo.met_by(p) and not math.isnan(p.tokens_per_s)]
    return max(eligible, key=lambda p: p.tokens_per_s, default=None)


def goodput_tokens_per_s(point: Point | None) -> float:
    return 0.0 if point is None else point.tokens_per_s


@dataclass(frozen=True)
class Fall:
    """A step of the concurrency sweep where throughput fell below the best at fewer streams."""

    previous_load: float
    load: float
    tokens_per_s: float
    best_load: float
    best_tokens_per_s: float

    @property
    def drop(self) -> float:
        """How far below the best at fewer streams, as a fraction of it."""
        return 1.0 - self.tokens_per_s / self.best_tokens_per_s

    def text(self) -> str:
        return (
            f"{self.previous_load:g} -> {self.load:g} streams: {self.tokens_per_s:,.0f} tok/s, "
            f"{self.drop:.1%} below the best at fewer streams ({self.best_tokens_per_s:,.0f} at "
            f"{self.best_load:g})"
        )


def _measured_tokens_per_s(p: Point) -> float:
    """``p``'s tokens/s, a run that measured nothing (NaN) counting as zero: a fall, not a skipped point."""
    return 0.0 if math.isnan(p.tokens_per_s) else p.tokens_per_s


def throughput_falls(points: Sequence[Point], target: str, tolerance: float) -> list[Fall]:
    """The steps of ``target``'s concurrency sweep (in order of streams) whose tokens/s is more than
    ``tolerance`` (a fraction, for noise) below the best at fewer streams. Comparing with the best so far,
    not the step before, so that a slow slide of small steps is caught too. A run that measured nothing
    (NaN) is a fall to zero."""
    if not 0 <= tolerance < 1:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    sweep = sorted((p for p in points if p.target == target and p.sweep == CONCURRENCY), key=lambda p: p.load)
    falls: list[Fall] = []
    best: Point | None = None
    previous: Point | None = None
    for p in sweep:
        tps = _measured_tokens_per_s(p)
        if best is not None and previous is not None and tps < best.tokens_per_s * (1 - tolerance):
            falls.append(Fall(previous.load, p.load, tps, best.load, best.tokens_per_s))
        if best is None or tps > best.tokens_per_s:
            best = replace(p, tokens_per_s=tps)
        previous = p
    return falls


def round_by_round_drops(runs: Sequence[Point], target: str, load: float) -> list[float]:
    """Per round, how far ``target``'s run at ``load`` streams is below its best run at fewer streams in
    the same round (a fraction; negative: above it), rounds in order. The sweep makes each round a pass
    over every point (bench/goodput.py ``sweep_order``), so a pair from one round shares the machine's
    state of those minutes, which two medians do not. A run that measured nothing (NaN) counts as zero."""
    sweep = [r for r in runs if r.target == target and r.sweep == CONCURRENCY]
    drops: list[float] = []
    for round_index in sorted({r.round_index for r in sweep if r.load == load}):
        same_round = [r for r in sweep if r.round_index == round_index]
        at = [_measured_tokens_per_s(r) for r in same_round if r.load == load]
        before = [_measured_tokens_per_s(r) for r in same_round if r.load < load]
        if at and before and max(before) > 0:
            drops.append(1 - at[0] / max(before))
    return drops


def _find(points: Sequence[Point], target: str, sweep: str, load: float) -> Point | None:
    return next((p for p in points if p.target == target and p.sweep == sweep and p.load == load), None)


def _round_by_round(runs: Sequence[Point], fall: Fall) -> str:
    drops = round_by_round_drops(runs, SLUICE, fall.load)
    if len(drops) < 2:
        return ""
    listed = ", ".join(f"{d:.1%}" for d in drops)
    median = statistics.median(drops)
    return f"; round by round, below that round's best at fewer streams: {listed} (median {median:.1%})"


def _verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("**met**" if met else "**not met**")


def _where(point: Point | None) -> str:
    if point is None:
        return "no point within the SLO"
    return (
        f"{point.tokens_per_s:,.0f} tok/s at {point.load_text()} ({point.sweep} sweep; TTFT p95 "
        f"{point.ttft_p95_ms:,.1f} ms, ITL p95 {point.itl_p95_ms:.2f} ms)"
    )


def headline_streams(points: Sequence[Point], wanted: int = 64) -> float | None:
    """The streams the high-load target is judged at: ``wanted`` if the sweep has it, else its largest."""
    loads = sorted({p.load for p in points if p.sweep == CONCURRENCY})
    if not loads:
        return None
    return float(wanted) if wanted in loads else loads[-1]


def target_lines(
    points: Sequence[Point],
    slo: Slo,
    tolerance: float,
    goodput_ratio_target: float = 2.0,
    headline_ratio_target: float = 1.3,
    runs: Sequence[Point] = (),
) -> list[str]:
    """Goodput per target and its ratio, then the issue's three targets, each met / not met, read off the
    median points: Sluice (safety none)'s goodput at least ``goodput_ratio_target`` x vLLM's; its tokens/s
    never falling as streams are added (beyond ``tolerance``); at 64 streams (or the sweep's largest) at
    least ``headline_ratio_target`` x vLLM's tokens/s with ITL p95 within the SLO. With the single
    ``runs``, each fall is also shown round by round (``round_by_round_drops``), beside the verdict."""
    targets = [t for t in TARGET_ORDER if any(p.target == t for p in points)]
    lines = [f"Goodput: the most output tok/s over the points (both sweeps) with {slo.text()} and no request "
             "refused or failed:"]  # fmt: skip
    best = {t: goodput(points, t, slo) for t in targets}
    lines += [f"- {TARGET_LABELS[t]}: {_where(best[t])}" for t in targets]
    if SLUICE not in best or VLLM not in best:
        return [*lines, "- Sluice (safety none) and vLLM did not both run: no ratio, no targets."]
    sluice_gp, vllm_gp = goodput_tokens_per_s(best[SLUICE]), goodput_tokens_per_s(best[VLLM])
    if vllm_gp > 0:
        ratio_text = f"{sluice_gp / vllm_gp:.2f}x"
    else:
        ratio_text = (
            "infinite (vLLM meets the SLO nowhere)" if sluice_gp > 0 else "undefined (neither meets it)"
        )
    # NOTE: the same with TTFT unbounded: on a shared 2-core VM one side's TTFT tail can be a stall of the
    # machine or the client (vLLM's, seen at 1-5 s from 8 streams), which decides the full-SLO ratio alone.
    itl_only = replace(slo, ttft_p95_ms=math.inf)
    sluice_itl, vllm_itl = (goodput(points, t, itl_only) for t in (SLUICE, VLLM))
    itl_ratio = goodput_tokens_per_s(sluice_itl) / max(goodput_tokens_per_s(vllm_itl), 1e-9)
    lines += [
        f"- goodput Sluice (safety none) / vLLM: {ratio_text}",
        f"- on the ITL SLO alone (TTFT p95 not bounded): Sluice (safety none) {_where(sluice_itl)}; "
        f"vLLM {_where(vllm_itl)}; ratio {itl_ratio:.2f}x",
        "",
        "Targets (Sluice with safety policy none):",
    ]
    gp_met = sluice_gp > 0 and sluice_gp >= goodput_ratio_target * vllm_gp
    itl_met = itl_ratio >= goodput_ratio_target
    lines.append(
        f"- goodput at least {goodput_ratio_target:g}x vLLM's, on the full SLO and on the ITL SLO alone: "
        f"{_verdict(gp_met and itl_met)}"
        + ("" if gp_met == itl_met else f" (full SLO {_verdict(gp_met)}, ITL alone {_verdict(itl_met)})")
    )
    sweep = [p for p in points if p.target == SLUICE and p.sweep == CONCURRENCY]
    if len(sweep) < 2:
        lines.append(f"- throughput never falls as streams are added (within {tolerance:.0%}): "
                     + _verdict(None) + " (fewer than two concurrency points)")  # fmt: skip
    else:
        falls = throughput_falls(points, SLUICE, tolerance)
        lines.append(
            f"- throughput never falls as streams are added (more than {tolerance:.0%} below the best at "
            f"fewer streams counts as a fall; less is noise): {_verdict(not falls)}"
            + "".join(f"\n  - falls at {f.text()}{_round_by_round(runs, f)}" for f in falls)
        )
    streams = headline_streams(points)
    sluice_hl = None if streams is None else _find(points, SLUICE, CONCURRENCY, streams)
    vllm_hl = None if streams is None else _find(points, VLLM, CONCURRENCY, streams)
    label = "64 streams" if streams == 64 else f"{streams:g} streams (the sweep has no 64)"
    if sluice_hl is None or vllm_hl is None or not vllm_hl.tokens_per_s > 0:
        lines.append(f"- at 64 streams, at least {headline_ratio_target:g}x vLLM's tok/s with ITL p95 <= "
                     f"{slo.itl_p95_ms:g} ms: {_verdict(None)}")  # fmt: skip
    else:
        ratio = sluice_hl.tokens_per_s / vllm_hl.tokens_per_s
        met = (
            ratio >= headline_ratio_target
            and sluice_hl.itl_p95_ms <= slo.itl_p95_ms
            and sluice_hl.errors == 0
        )
        lines.append(
            f"- at {label}, at least {headline_ratio_target:g}x vLLM's tok/s with ITL p95 <= "
            f"{slo.itl_p95_ms:g} ms: {ratio:.2f}x ({sluice_hl.tokens_per_s:,.0f} vs "
            f"{vllm_hl.tokens_per_s:,.0f} tok/s), ITL p95 "
            f"{sluice_hl.itl_p95_ms:.2f} ms: {_verdict(met)}"
        )
    return lines


def _cell(value: float, decimals: int) -> str:
    return "-" if math.isnan(value) else f"{value:,.{decimals}f}"


def sweep_table(points: Sequence[Point], sweep: str, slo: Slo) -> str:
    """The markdown table of one sweep's median points: per load, one row per target, each metric, the
    tokens/s ratio to vLLM's at that load, and whether the point meets the SLO."""
    mine = [p for p in points if p.sweep == sweep]
    if not mine:
        return ""
    load_label = "streams" if sweep == CONCURRENCY else "req/s offered"
    late = sweep == RATE
    header = [load_label, "target", "served", "errors", *(label for _, label, _ in METRICS), "vs vLLM tok/s",
              *(["sent late p95"] if late else []), "within SLO"]  # fmt: skip
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for load in sorted({p.load for p in mine}):
        vllm = _find(mine, VLLM, sweep, load)
        for target in TARGET_ORDER:
            p = _find(mine, target, sweep, load)
            if p is None:
                continue
            vs = (
                f"{p.tokens_per_s / vllm.tokens_per_s:.2f}x"
                if target != VLLM
                and vllm is not None
                and vllm.tokens_per_s > 0
                and not math.isnan(p.tokens_per_s)
                else "-"
            )
            cells = [f"{load:g}", TARGET_LABELS[target], str(p.requests), str(p.errors),
                     *(_cell(getattr(p, name), d) for name, _, d in METRICS), vs,
                     *([_cell(p.late_p95_ms, 1)] if late else []),
                     "yes" if slo.met_by(p) else "no"]  # fmt: skip
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
