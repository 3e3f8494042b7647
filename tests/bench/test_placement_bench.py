"""The placement benchmark's pure parts: its workload of shared system prompts, the hit-rate arithmetic
over telemetry records, the summary table and its arguments. No server is started."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bench.placement_bench import parse_args
from bench.placement_workload import (
    RunResult,
    comparison,
    hit_rate,
    make_workload,
    max_hit_rate,
    median_range,
    summary_table,
)

POOL = list(range(100, 400))


def workload(prompts_seed: int = 1, items_seed: int = 2, num_requests: int = 600) -> Any:
    return make_workload(POOL, 4, 3, 256, 8, num_requests, prompts_seed=prompts_seed, items_seed=items_seed)


def test_the_workload_is_tenants_times_prompts_shared_by_many_requests() -> None:
    w = workload()
    assert len(w.system_prompts) == 12 and all(len(p) == 256 for p in w.system_prompts.values())
    assert len({tuple(p) for p in w.system_prompts.values()}) == 12  # twelve different prompts
    assert len(w.items) == 600
    prompt = w.prompt(w.items[0])
    assert (
        len(prompt) == 264
        and prompt[:256] == w.system_prompts[(w.items[0].tenant_id, w.items[0].prompt_index)]
    )
    assert set(prompt) <= set(POOL)
    # Every (tenant, prompt) is asked for, about evenly (50 each of 600).
    counts = Counter((i.tenant_id, i.prompt_index) for i in w.items)
    assert len(counts) == 12 and all(25 <= n <= 80 for n in counts.values()), counts
    assert len({i.suffix for i in w.items}) > 590  # the user parts differ


def test_runs_of_a_round_ask_in_the_same_order_for_fresh_prompts() -> None:
    a, b = workload(prompts_seed=1), workload(prompts_seed=2)
    assert a.items == b.items  # same tenants, prompt indexes and suffixes, in the same order
    assert all(a.system_prompts[k] != b.system_prompts[k] for k in a.system_prompts)  # nothing cached carries
    assert workload(prompts_seed=1).system_prompts == a.system_prompts  # deterministic
    assert workload(items_seed=3).items != a.items


def test_a_workload_with_nothing_in_it_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        make_workload(POOL, 0, 3, 256, 8, 10, prompts_seed=0, items_seed=0)
    with pytest.raises(ValueError, match="suffix"):
        make_workload(POOL, 4, 3, 256, -1, 10, prompts_seed=0, items_seed=0)


def record(cached: int | None, prompt: int = 264, outcome: str = "finished") -> dict[str, Any]:
    return {"request_id": "r", "prompt_tokens": prompt, "cached_tokens": cached, "outcome": outcome}


def test_the_hit_rate_is_cached_over_prompt_tokens_of_finished_requests() -> None:
    assert hit_rate([record(256), record(0)]) == pytest.approx(256 / 528)
    assert hit_rate([record(128, prompt=256), record(0, prompt=768)]) == pytest.approx(128 / 1024)  # tokens
    # A request that did not finish has no final response: it is left out, not counted as a miss.
    assert hit_rate([record(256), record(None, outcome="failed")]) == pytest.approx(256 / 264)


def test_a_hit_rate_without_the_replicas_count_is_refused() -> None:
    with pytest.raises(ValueError, match="no cached_tokens"):
        hit_rate([record(256), record(None)])
    with pytest.raises(ValueError, match="no finished request"):
        hit_rate([record(None, outcome="cancelled")])


def test_the_table_gives_each_placements_median_and_range_over_rounds() -> None:
    assert median_range([3.0, 1.0, 2.0]) == "2.0 [1.0-3.0]"
    assert median_range([10.0, 30.0], "{:.0f}") == "20 [10-30]"
    assert median_range([]) == "n/a"
    runs = [
        RunResult("score", 0, 0.80, 100.0, 300.0, 2000.0, 96, {"r1": 30, "r2": 66}),
        RunResult("score", 1, 0.90, 120.0, 200.0, 2100.0, 96, {"r1": 50, "r2": 46}),
        RunResult("random", 0, 0.30, 150.0, 400.0, 1800.0, 96, {"r1": 48, "r2": 48}),
    ]
    header, rule, score_row, random_row = summary_table(runs, ["score", "random"])
    assert header.startswith("| placement |") and rule.count("---") == 6
    assert (
        score_row
        == "| score | 85.0 [80.0-90.0] | 110 [100-120] | 250 [200-300] | 2050 [2000-2100] | 30,66 / 50,46 |"
    )
    assert random_row.startswith("| random | 30.0 [30.0-30.0] |")


def test_the_arguments_name_known_placements_only() -> None:
    args = parse_args(["--placements", "random,score", "--rounds", "3"])
    assert args.placements == ["random", "score"] and args.rounds == 3
    assert parse_args([]).placements == ["score", "least_loaded", "random"]
    with pytest.raises(SystemExit):
        parse_args(["--placements", "score,round_robin"])
    with pytest.raises(SystemExit):
        parse_args(["--requests", "0"])


def test_the_comparison_puts_the_score_against_each_baseline() -> None:
    runs = [
        RunResult("score", 0, 0.75, 200.0, 400.0, 2500.0, 96, {}),
        RunResult("least_loaded", 0, 0.55, 250.0, 500.0, 2000.0, 96, {}),
        RunResult("random", 0, 0.60, 200.0, 800.0, 2500.0, 96, {}),
    ]
    assert comparison(runs, ["score", "least_loaded", "random"]) == (
        "Score (medians) against least_loaded: hit rate +20.0 points, TTFT p50 -20%, TTFT p95 -20%, "
        "tok/s +25%; against random: hit rate +15.0 points, TTFT p50 +0%, TTFT p95 -50%, tok/s +0%."
    )
    assert comparison(runs[1:], ["least_loaded", "random"]) == ""  # no score to compare
    assert comparison(runs[:1], ["score"]) == ""
    assert max_hit_rate(256, 8) == pytest.approx(256 / 264)
    assert max_hit_rate(250, 10) == pytest.approx(240 / 260)  # the partial block never hits
