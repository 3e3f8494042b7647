"""The long-prompt pool benchmark's pure parts: its open-loop arrivals, the per-run percentiles, the
summary table and the comparison, and its arguments. No server is started."""

from __future__ import annotations

import numpy as np
import pytest

from bench.long_prompt_pool import (
    LONG,
    SHORT,
    RunResult,
    comparison,
    parse_args,
    poisson_times,
    schedule,
    summary_table,
)


def test_arrivals_are_a_poisson_stream_of_each_kind_the_same_for_the_same_seed() -> None:
    times = poisson_times(10.0, 100.0, np.random.default_rng(1))
    assert times == sorted(times) and times[0] > 0 and times[-1] < 100.0
    assert 850 <= len(times) <= 1150  # 10/s for 100 s: 1,000 +- 5 standard deviations
    gaps = np.diff(times)
    assert 0.09 <= float(gaps.mean()) <= 0.11
    arrivals = schedule(6.0, 0.5, 60.0, seed=3)
    assert arrivals == schedule(6.0, 0.5, 60.0, seed=3) != schedule(6.0, 0.5, 60.0, seed=4)
    assert [a.at_s for a in arrivals] == sorted(a.at_s for a in arrivals)
    num_long = sum(1 for a in arrivals if a.kind == LONG)
    assert 10 <= num_long <= 55 and 250 <= len(arrivals) - num_long <= 470
    assert poisson_times(0.0, 10.0, np.random.default_rng(0)) == []


def _run(layout: str, round_index: int, short_ms: list[float], long_ms: list[float]) -> RunResult:
    return RunResult(layout, round_index, tuple(short_ms), tuple(long_ms), 0, {"r1 short": len(short_ms)})


def test_percentiles_table_and_comparison_are_medians_over_rounds() -> None:
    one = _run("one-pool", 0, [float(v) for v in range(1, 101)], [1000.0, 3000.0])
    assert one.ttft_ms(SHORT, 50) == pytest.approx(50.5) and one.ttft_ms(SHORT, 95) == pytest.approx(95.05)
    assert one.ttft_ms(LONG, 50) == pytest.approx(2000.0)
    results = [
        _run("one-pool", 0, [100.0] * 19 + [400.0], [2000.0]),  # p95 of 19x100 and 400: 115
        _run("one-pool", 1, [100.0] * 20, [2000.0]),
        _run("one-pool", 2, [200.0] * 20, [2000.0]),
        _run("split", 0, [50.0] * 20, [3000.0]),
        _run("split", 1, [50.0] * 20, [3000.0]),
        _run("split", 2, [60.0] * 20, [3000.0]),
    ]
    header, rule, one_row, split_row = summary_table(results)
    assert header.startswith("| layout | short TTFT p50") and rule.count("|") == 8
    assert one_row.startswith("| one-pool | 100 [100-200] | 115 [100-200] | 2000 [2000-2000] |")
    assert split_row.startswith("| split | 50 [50-60] | 50 [50-60] | 3000 [3000-3000] |")
    assert one_row.endswith("| 0 | r1 short 20 |")
    sentence = comparison(results)
    assert "short TTFT p50 -50%" in sentence and "short TTFT p95 -57%" in sentence  # 50 / 115
    assert "long TTFT p50 +50%" in sentence
    assert comparison(results[:3]) == ""


def test_arguments_keep_short_prompts_under_the_threshold_and_long_ones_at_or_over_it() -> None:
    args = parse_args([])
    assert args.short_tokens < args.threshold_tokens <= args.long_tokens <= 1536  # the gateway's prompt limit
    for bad in (
        ["--threshold-tokens", "32"],
        ["--long-tokens", "1000"],
        ["--long-rate", "0"],
        ["--rounds", "0"],
    ):
        with pytest.raises(SystemExit):
            parse_args(bad)
