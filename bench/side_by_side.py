"""The pure parts of the side-by-side benchmark (bench/e2e_side_by_side.py): the order the servers run in,
a fresh seed per run, and the table of medians and ratios. No servers, no I/O.

One run is one closed-loop load (C streams, N requests) against one target; a target is a served stack
or the engine alone ("engine"). Sluice is served twice: to a tenant whose safety policy is ``none``
("sluice", like for like with vLLM, which screens nothing: the issue's targets are judged on it) and to
one with the ``pii`` policy ("sluice-default", the screened target: its PII screen holds back a word that
could still become an e-mail address until the next token decides it, so text leaves in word-sized bursts; the
table shows what that costs). Each run is reduced to a ``RunResult`` of a few figures; a table cell is
the median of a target's runs at one concurrency, with their range beside it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.cpu_split import (
    CLIENT,
    ENGINE_THREADS,
    OTHER_THREADS,
    CpuSplit,
    on_serving_path,
    share_bound_us_per_token,
    share_ceiling,
)
from bench.report import pct

SLUICE, SLUICE_DEFAULT, VLLM, ENGINE = "sluice", "sluice-default", "vllm", "engine"
# The engine alone on the replica's own threads (decode steps and numpy's BLAS on every core but one, prefill
# steps' kernels on what the repository says), where ENGINE runs on this process's (by default every core):
# the stack's share of ENGINE_TEAM is what the serving path costs; of ENGINE, also the core the replica
# leaves to that path.
ENGINE_TEAM = "engine-team"
# (attribute of RunResult, row label, how many decimals the cells show)
METRICS: tuple[tuple[str, str, int], ...] = (
    ("tokens_per_s", "output tok/s", 0),
    ("ttft_p50_ms", "TTFT p50 ms", 1),
    ("ttft_p95_ms", "TTFT p95 ms", 1),
    ("itl_p50_ms", "ITL p50 ms", 2),
    ("itl_p95_ms", "ITL p95 ms", 2),
    ("itl_p99_ms", "ITL p99 ms", 2),
    ("tpot_p50_ms", "TPOT p50 ms", 2),
    ("tpot_p95_ms", "TPOT p95 ms", 2),
)
TABLE_HEADER = (
    "| streams | metric | Sluice (safety none) | Sluice (safety pii) | vLLM | Sluice / vLLM "
    "| pii / none | engine alone | Sluice / engine | engine alone, replica's threads | Sluice / that |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|"
)


@dataclass(frozen=True)
class RunResult:
    """One run's figures: output tokens per second over the run, and latency percentiles in ms."""

    target: str
    concurrency: int
    round_index: int
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    itl_p99_ms: float
    # Over requests of (last chunk - first chunk) / (tokens - 1), median and p95: NaN where not measured.
    # A burst of chunks does not skew it, so its p95 is the tail of a stream's pace that bursts hide.
    tpot_p50_ms: float = math.nan
    tpot_p95_ms: float = math.nan
    cpu: CpuSplit | None = None  # where the cores went during the run, where it was measured

    @classmethod
    def from_samples(
        cls,
        target: str,
        concurrency: int,
        round_index: int,
        tokens_per_s: float,
        ttft_ms: Sequence[float],
        itl_ms: Sequence[float],
        tpot_ms: Sequence[float] = (),
    ) -> RunResult:
        """Reduce one run's raw TTFT, inter-token and per-request time-per-token samples to percentiles."""
        ttft, itl, tpot = list(ttft_ms), list(itl_ms), list(tpot_ms)
        return cls(
            target,
            concurrency,
            round_index,
            tokens_per_s,
            pct(ttft, 50),
            pct(ttft, 95),
            pct(itl, 50),
            pct(itl, 95),
            pct(itl, 99),
            pct(tpot, 50),
            pct(tpot, 95),
        )

    def line(self) -> str:
        """A one-line progress report."""
        return (
            f"{self.target:<14} streams {self.concurrency:>3} round {self.round_index + 1}: "
            f"{self.tokens_per_s:,.0f} tok/s, TTFT p50/p95 {self.ttft_p50_ms:.1f}/{self.ttft_p95_ms:.1f} ms, "
            f"ITL p50/p95/p99 {self.itl_p50_ms:.1f}/{self.itl_p95_ms:.1f}/{self.itl_p99_ms:.1f} ms, "
            f"TPOT p50/p95 {self.tpot_p50_ms:.2f}/{self.tpot_p95_ms:.2f} ms"
        )


def alternation(targets: Sequence[str], num_rounds: int) -> list[tuple[int, str]]:
    """The order runs are made in: every target once per round, in the given order, round after round
    (sluice, vllm, sluice, vllm, ...), so slow drift in the machine falls on every target alike and only
    one target is ever under load. Returns (round index, target) pairs."""
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be at least 1, got {num_rounds}")
    if len(set(targets)) != len(targets) or not targets:
        raise ValueError(f"targets must be distinct and not empty, got {list(targets)}")
    return [(r, t) for r in range(num_rounds) for t in targets]


def run_seed(base_seed: int, round_index: int, concurrency: int) -> int:
    """The prompt seed of one run: fresh for every (round, concurrency), so no run meets prompts a server
    has cached before; shared by the targets of one round, so they serve the same prompts. Round -1 is
    the warm-up."""
    return base_seed + 1_000 * (round_index + 1) + concurrency


def _values(results: Sequence[RunResult], target: str, concurrency: int, name: str) -> list[float]:
    """One metric of ``target``'s runs at ``concurrency``, leaving out runs that did not measure it."""
    runs = (r for r in results if r.target == target and r.concurrency == concurrency)
    return [v for v in (getattr(r, name) for r in runs) if not math.isnan(v)]


def medians(results: Sequence[RunResult], target: str, concurrency: int) -> dict[str, float] | None:
    """Each metric's median over ``target``'s runs at ``concurrency`` (NaN for one no run measured);
    None if the target has no run there."""
    if not any(r.target == target and r.concurrency == concurrency for r in results):
        return None
    return {
        name: statistics.median(v) if (v := _values(results, target, concurrency, name)) else math.nan
        for name, _, _ in METRICS
    }


def value_range(
    results: Sequence[RunResult], target: str, concurrency: int, name: str
) -> tuple[float, float]:
    values = _values(results, target, concurrency, name)
    return (min(values), max(values)) if values else (math.nan, math.nan)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None where either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or math.isnan(numerator) or not denominator > 0:
        return None
    return numerator / denominator


def _get(figures: dict[str, float] | None, name: str) -> float | None:
    return None if figures is None else figures[name]


def _number(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def _cell(results: Sequence[RunResult], target: str, concurrency: int, name: str, decimals: int) -> str:
    """ "median (min-max)" over the runs; the median alone for one run; a dash for none."""
    mid = medians(results, target, concurrency)
    if mid is None or math.isnan(mid[name]):
        return "-"
    low, high = value_range(results, target, concurrency, name)
    text = _number(mid[name], decimals)
    if low != high:
        text += f" ({_number(low, decimals)}-{_number(high, decimals)})"
    return text


def _ratio_cell(value: float | None, as_share: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:.0%}" if as_share else f"{value:.2f}x"


def comparison_table(results: Sequence[RunResult], concurrencies: Sequence[int]) -> str:
    """The markdown table: per concurrency, one row per metric with each target's median (and range) and
    the ratios of the medians: Sluice (safety none) / vLLM, Sluice's default policy / none (the safety
    screen's cost) and, for throughput, Sluice (safety none) / engine alone (the share of the engine's own
    tokens/s that the served stack delivers), on this process's threads and on the replica's."""
    rows = [TABLE_HEADER]
    for c in concurrencies:
        sluice, screened, vllm, engine, team = (
            medians(results, t, c) for t in (SLUICE, SLUICE_DEFAULT, VLLM, ENGINE, ENGINE_TEAM)
        )
        for name, label, decimals in METRICS:
            vs_vllm = ratio(_get(sluice, name), _get(vllm, name))
            screen = ratio(_get(screened, name), _get(sluice, name))
            throughput = name == "tokens_per_s"
            share = ratio(_get(sluice, name), _get(engine, name)) if throughput else None
            team_share = ratio(_get(sluice, name), _get(team, name)) if throughput else None
            cells = [
                str(c),
                label,
                _cell(results, SLUICE, c, name, decimals),
                _cell(results, SLUICE_DEFAULT, c, name, decimals),
                _cell(results, VLLM, c, name, decimals),
                _ratio_cell(vs_vllm),
                _ratio_cell(screen),
                _cell(results, ENGINE, c, name, decimals),
                _ratio_cell(share, as_share=True),
                _cell(results, ENGINE_TEAM, c, name, decimals),
                _ratio_cell(team_share, as_share=True),
            ]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _verdict(value: float | None, met: bool) -> str:
    return "not measured" if value is None else ("met" if met else "not met")


def target_lines(results: Sequence[RunResult], concurrency: int = 32) -> list[str]:
    """Issue 10's end-to-end targets at ``concurrency`` streams, read off the medians of Sluice with safety
    policy none (like for like with vLLM): the served stack keeps at least 75% of the engine-alone
    tokens/s; its inter-token p95 is no worse than vLLM's and under 2x its own p50; and it keeps its lead
    in tokens/s and TTFT p95. The share is judged twice: against the engine alone on this process's
    threads (as issue 10 set it) and on the replica's own (what the serving path costs, apart from the
    thread the replica leaves to it). Then what the default policy's screen costs. Empty if Sluice did not
    run."""
    sluice, screened, vllm, engine, team = (
        medians(results, t, concurrency) for t in (SLUICE, SLUICE_DEFAULT, VLLM, ENGINE, ENGINE_TEAM)
    )
    if sluice is None:
        return []
    share = ratio(sluice["tokens_per_s"], _get(engine, "tokens_per_s"))
    team_share = ratio(sluice["tokens_per_s"], _get(team, "tokens_per_s"))
    itl_vs_vllm = ratio(sluice["itl_p95_ms"], _get(vllm, "itl_p95_ms"))
    itl_tail = ratio(sluice["itl_p95_ms"], sluice["itl_p50_ms"])
    tps = ratio(sluice["tokens_per_s"], _get(vllm, "tokens_per_s"))
    ttft = ratio(sluice["ttft_p95_ms"], _get(vllm, "ttft_p95_ms"))
    lead = None if tps is None or ttft is None else tps
    tpot = ratio(sluice["tpot_p50_ms"], _get(vllm, "tpot_p50_ms"))
    tpot_tail = ratio(sluice["tpot_p95_ms"], _get(vllm, "tpot_p95_ms"))
    screen = {name: ratio(_get(screened, name), sluice[name]) for name, _, _ in METRICS}
    return [
        f"Issue 10's targets at {concurrency} streams (medians; Sluice with safety policy none):",
        f"- served share of the engine-alone tok/s {_ratio_cell(share, as_share=True)} (at least 75%): "
        + _verdict(share, share is not None and share >= 0.75),
        f"- ITL p95 Sluice / vLLM {_ratio_cell(itl_vs_vllm)} (at most 1x): "
        + _verdict(itl_vs_vllm, itl_vs_vllm is not None and itl_vs_vllm <= 1.0),
        f"- Sluice's ITL p95 / its own p50 {_ratio_cell(itl_tail)} (under 2x): "
        + _verdict(itl_tail, itl_tail is not None and itl_tail < 2.0),
        f"- lead over vLLM: tok/s {_ratio_cell(tps)}, TTFT p95 {_ratio_cell(ttft)} (above 1x and below 1x): "
        + _verdict(lead, tps is not None and ttft is not None and tps > 1.0 and ttft < 1.0),
        f"- served share of the engine alone on the replica's own threads {_ratio_cell(team_share, True)} "
        "(at least 75%): " + _verdict(team_share, team_share is not None and team_share >= 0.75),
        "- for reference, time per output token (bursts do not skew it): Sluice / vLLM p50 "
        + f"{_ratio_cell(tpot)}, p95 {_ratio_cell(tpot_tail)}",
        "- the pii safety policy's cost (pii / none): tok/s "
        + f"{_ratio_cell(screen['tokens_per_s'])}, TTFT p95 {_ratio_cell(screen['ttft_p95_ms'])}, ITL p95 "
        + f"{_ratio_cell(screen['itl_p95_ms'])}, TPOT p95 {_ratio_cell(screen['tpot_p95_ms'])}",
    ]


TARGET_LABELS = {
    SLUICE: "Sluice (safety none)",
    SLUICE_DEFAULT: "Sluice (safety pii)",
    VLLM: "vLLM",
    ENGINE: "engine alone",
    ENGINE_TEAM: "engine alone, replica's threads",
}


def _cpu_splits(results: Sequence[RunResult], target: str, concurrency: int) -> list[CpuSplit]:
    return [r.cpu for r in results if r.target == target and r.concurrency == concurrency and r.cpu]


def _median_us_per_token(splits: Sequence[CpuSplit], part: str | None) -> float:
    """The median over runs of one part's CPU microseconds per output token (``None``: all parts)."""
    return statistics.median(s.total_us_per_token if part is None else s.us_per_token(part) for s in splits)


def _median_us_per_chunk(splits: Sequence[CpuSplit], part: str | None) -> str:
    """The median over runs of one part's CPU microseconds per text chunk (``None``: all parts), or "-"
    where no run counted its chunks."""
    values = [v for v in (s.us_per_chunk(part) for s in splits) if v is not None]
    return f"{statistics.median(values):,.0f}" if values else "-"


def cpu_table(results: Sequence[RunResult], concurrency: int) -> str:
    """Where the cores went at ``concurrency`` streams: per target measured, per part of its processes,
    the median over runs of the cores it kept busy, its CPU microseconds per output token and per text
    chunk the client read (a chunk is one message through the whole path; how many tokens it carries is
    on the **all** row). Empty if no run measured its CPU."""
    targets = [t for t in TARGET_LABELS if _cpu_splits(results, t, concurrency)]
    if not targets:
        return ""
    rows = [
        "| target | part | cores busy | CPU µs per output token | CPU µs per text chunk |",
        "|---|---|---|---|---|",
    ]
    for target in targets:
        splits = _cpu_splits(results, target, concurrency)
        label = TARGET_LABELS[target]
        parts = sorted({p for s in splits for p in s.cpu_s}, key=lambda p: -_median_us_per_token(splits, p))
        # A part that was idle through the run (a model no request used) is left out; "all" counts it.
        for part in (p for p in parts if _median_us_per_token(splits, p) >= 0.5):
            cores = statistics.median(s.cores(part) for s in splits)
            us, us_chunk = _median_us_per_token(splits, part), _median_us_per_chunk(splits, part)
            rows.append(f"| {label} | {part} | {cores:.2f} | {us:,.0f} | {us_chunk} |")
        total_cores = statistics.median(sum(s.cores(p) for p in s.cpu_s) for s in splits)
        us, us_chunk = _median_us_per_token(splits, None), _median_us_per_chunk(splits, None)
        per_chunk = [v for v in (s.tokens_per_chunk for s in splits) if v is not None]
        all_label = f"**all** ({statistics.median(per_chunk):.2f} tokens a chunk)" if per_chunk else "**all**"
        rows.append(f"| {label} | {all_label} | {total_cores:.2f} | {us:,.0f} | {us_chunk} |")
    return "\n".join(rows)


def share_bound_lines(results: Sequence[RunResult], concurrency: int, num_cores: int) -> list[str]:
    """What the served-share target asks of the CPU per token on this machine, beside what Sluice (safety
    none) spent: every process shares the same ``num_cores``, so the share cannot exceed what those cores
    buy at Sluice's CPU per token. Empty unless both Sluice's CPU and the engine alone were measured."""
    engine = medians(results, ENGINE, concurrency)
    sluice, alone = _cpu_splits(results, SLUICE, concurrency), _cpu_splits(results, ENGINE, concurrency)
    if engine is None or not sluice or not engine["tokens_per_s"] > 0:
        return []
    engine_tps = engine["tokens_per_s"]
    allowed_us = share_bound_us_per_token(num_cores, engine_tps, 0.75)
    spent_us = _median_us_per_token(sluice, None)
    engine_us = f"{_median_us_per_token(alone, None):,.0f}" if alone else "-"
    return [
        f"- what the 75% share asks of the CPU at {concurrency} streams on these {num_cores} cores: the "
        f"engine alone made {engine_tps:,.0f} tok/s, so 75% of it leaves {allowed_us:,.0f} µs of CPU per "
        "output token for every process together, the load generator included; Sluice (safety none) "
        f"spent {spent_us:,.0f} (the engine alone, by itself, {engine_us}), at which the cores, fully busy, "
        f"serve at most {share_ceiling(num_cores, spent_us, engine_tps):.0%} of the engine-alone tokens/s",
    ]


# Issue 22, item 4: the serving path's CPU per output token at 32 streams, at most this.
SERVING_PATH_TARGET_US = 120.0


def serving_path_lines(results: Sequence[RunResult], concurrency: int) -> list[str]:
    """Sluice's (safety none) serving path CPU per output token: the gateway, tritonserver and the engine
    model's threads other than the engine's (its send path and Triton's stub), beside the engine thread's
    and the client's. Empty unless the engine model's threads were told apart (``bench.cpu_split``)."""
    splits = _cpu_splits(results, SLUICE, concurrency)
    engine_parts = sorted({p for s in splits for p in s.cpu_s if p.endswith(ENGINE_THREADS)})
    if not splits or len(engine_parts) != 1:
        return []
    labels = {"gateway": "gateway", "tritonserver": "tritonserver"}
    labels[engine_parts[0].removesuffix(ENGINE_THREADS) + OTHER_THREADS] = "the engine model's other threads"
    assert all(on_serving_path(part) for part in labels)  # cpu_split's serving path, each part named
    us = {label: _median_us_per_token(splits, part) for part, label in labels.items()}
    total_us = sum(us.values())  # of the parts' medians, so the line adds up
    met = "met" if total_us <= SERVING_PATH_TARGET_US else "not met"
    parts = " + ".join(f"{label} {value:,.0f}" for label, value in us.items())
    return [
        f"- the serving path's CPU per output token at {concurrency} streams (issue 22: at most "
        f"{SERVING_PATH_TARGET_US:.0f} µs): {parts} = {total_us:,.0f} µs: {met} (beside it, the engine "
        f"thread {_median_us_per_token(splits, engine_parts[0]):,.0f}, the client "
        f"{_median_us_per_token(splits, CLIENT):,.0f})",
    ]
