"""The goodput benchmark's pure parts (bench/goodput_core.py and the helpers of bench/goodput.py): which
point is goodput, the check that throughput does not fall as streams are added, the open-loop arrival
schedule, medians over rounds, the targets' verdicts, the seeds and the options. No server is started."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from bench import goodput, goodput_core
from bench.goodput_core import (
    CONCURRENCY,
    RATE,
    Point,
    Slo,
    arrival_schedule,
    median_points,
    sweep_table,
    target_lines,
    throughput_falls,
)
from bench.side_by_side import SLUICE, VLLM


def point(
    target: str,
    load: float,
    tokens_per_s: float,
    ttft_p95_ms: float = 100.0,
    itl_p95_ms: float = 20.0,
    sweep: str = CONCURRENCY,
    errors: int = 0,
    round_index: int = 0,
) -> Point:
    return Point(target, sweep, load, round_index, 10, errors, tokens_per_s, ttft_p95_ms=ttft_p95_ms,
                 itl_p95_ms=itl_p95_ms)  # fmt: skip


SLO = Slo(ttft_p95_ms=500.0, itl_p95_ms=40.0)


def test_goodput_is_the_fastest_point_within_the_slo_over_both_sweeps() -> None:
    points = [
        point(SLUICE, 8, 1_000),
        point(SLUICE, 32, 2_000),
        point(SLUICE, 64, 3_000, itl_p95_ms=41.0),  # faster, but over the ITL bound
        point(SLUICE, 32, 2_500, sweep=RATE),  # the best that meets it is in the rate sweep
        point(SLUICE, 48, 2_900, ttft_p95_ms=501.0, sweep=RATE),  # over the TTFT bound
        point(VLLM, 64, 9_000),  # another target's
    ]
    best = goodput_core.goodput(points, SLUICE, SLO)
    assert best is not None and (best.sweep, best.load, best.tokens_per_s) == (RATE, 32, 2_500)
    # The bounds are settable: with a looser ITL bound the 64-stream point counts.
    loose = goodput_core.goodput(points, SLUICE, Slo(500.0, 45.0))
    assert loose is not None and loose.load == 64


def test_a_point_with_a_refused_request_or_nothing_measured_is_not_goodput() -> None:
    points = [
        point(SLUICE, 8, 1_000),
        point(SLUICE, 16, 5_000, errors=1),  # fast because it shed load
        point(SLUICE, 32, math.nan, ttft_p95_ms=math.nan, itl_p95_ms=math.nan),
    ]
    best = goodput_core.goodput(points, SLUICE, SLO)
    assert best is not None and best.load == 8
    assert goodput_core.goodput([point(SLUICE, 8, 1_000, ttft_p95_ms=900.0)], SLUICE, SLO) is None


def test_throughput_that_keeps_rising_or_dips_within_the_tolerance_does_not_fall() -> None:
    rising = [point(SLUICE, c, t) for c, t in ((1, 300), (2, 550), (4, 900), (8, 1_500))]
    assert throughput_falls(rising, SLUICE, 0.05) == []
    dip = [point(SLUICE, 1, 300), point(SLUICE, 2, 1_000), point(SLUICE, 4, 960), point(SLUICE, 8, 1_100)]
    assert throughput_falls(dip, SLUICE, 0.05) == []  # 4% below the best: noise


def test_a_fall_names_its_step_and_how_far_it_fell() -> None:
    points = [point(SLUICE, c, t) for c, t in ((1, 300), (8, 2_000), (32, 1_700), (64, 2_100))]
    points.append(point(VLLM, 64, 10.0))  # another target's points do not count
    [fall] = throughput_falls(points, SLUICE, 0.05)
    assert (fall.previous_load, fall.load, fall.best_load) == (8, 32, 8)
    assert fall.drop == pytest.approx(0.15)
    assert "8 -> 32 streams" in fall.text() and "15.0%" in fall.text()


def test_a_slow_slide_of_small_steps_is_caught_against_the_best_so_far() -> None:
    # Each step is 4% below the one before (under the tolerance), but 64 is 11.5% below 8's.
    points = [point(SLUICE, c, t) for c, t in ((8, 1_000), (16, 960), (32, 921.6), (64, 884.7))]
    falls = throughput_falls(points, SLUICE, 0.05)
    assert [(f.previous_load, f.load) for f in falls] == [(16, 32), (32, 64)]
    assert falls[-1].drop == pytest.approx(0.1153, abs=1e-3)


def test_a_run_that_measured_nothing_is_a_fall_and_the_tolerance_is_checked() -> None:
    points = [point(SLUICE, 1, 300), point(SLUICE, 2, math.nan)]
    assert [f.tokens_per_s for f in throughput_falls(points, SLUICE, 0.05)] == [0.0]
    with pytest.raises(ValueError):
        throughput_falls(points, SLUICE, 1.0)


def test_the_arrival_schedule_is_the_same_for_the_same_seed_and_fresh_for_another() -> None:
    a = arrival_schedule(16.0, 10.0, 1_000, seed=42)
    assert a == arrival_schedule(16.0, 10.0, 1_000, seed=42)
    assert a != arrival_schedule(16.0, 10.0, 1_000, seed=43)
    assert a == sorted(a) and a[0] > 0 and a[-1] <= 10.0


def test_the_arrival_schedule_is_poisson_at_the_rate_and_bounded_in_time_and_count() -> None:
    counts = [len(arrival_schedule(20.0, 50.0, 100_000, seed)) for seed in range(20)]
    assert np.mean(counts) == pytest.approx(1_000, rel=0.03)  # rate x duration
    gaps = np.diff(arrival_schedule(20.0, 500.0, 100_000, seed=1))
    assert np.mean(gaps) == pytest.approx(0.05, rel=0.05)
    assert np.std(gaps) == pytest.approx(0.05, rel=0.1)  # exponential: sd = mean; a fixed pace has 0
    assert len(arrival_schedule(64.0, 60.0, 37, seed=1)) == 37
    # The count bound keeps a prefix of the time-bounded schedule: the same requests at the same times.
    assert arrival_schedule(64.0, 60.0, 37, seed=1) == arrival_schedule(64.0, 60.0, 10_000, seed=1)[:37]
    for bad in ((0.0, 1.0, 1), (1.0, 0.0, 1), (1.0, 1.0, 0)):
        with pytest.raises(ValueError):
            arrival_schedule(*bad, seed=1)


def test_median_points_take_each_figures_median_and_sum_the_errors() -> None:
    runs = [
        point(SLUICE, 8, t, ttft_p95_ms=f, errors=e, round_index=i)
        for i, (t, f, e) in enumerate(((1_000, 90.0, 0), (1_200, 300.0, 1), (1_100, 100.0, 0)))
    ]
    runs.append(point(VLLM, 8, 700))
    sluice, vllm = median_points(runs)
    assert (sluice.target, sluice.round_index, sluice.tokens_per_s, sluice.ttft_p95_ms) == (
        SLUICE,
        -1,
        1_100,
        100,
    )
    assert (sluice.requests, sluice.errors) == (30, 1)
    assert math.isnan(sluice.ttft_p50_ms)  # measured by no run
    assert vllm.tokens_per_s == 700
    with pytest.raises(ValueError):
        Point.median_of([point(SLUICE, 8, 1.0), point(SLUICE, 16, 1.0)])


def test_from_samples_reduces_a_run_to_its_percentiles() -> None:
    samples = [float(v) for v in range(1, 102)]
    p = Point.from_samples(SLUICE, RATE, 8.0, 0, 101, 0, 500.0, samples, samples, samples, [1.0] * 10)
    assert (p.ttft_p50_ms, p.ttft_p95_ms, p.ttft_p99_ms) == (51.0, 96.0, 100.0)
    assert (p.itl_p99_ms, p.tpot_p95_ms, p.late_p95_ms) == (100.0, 96.0, 1.0)


def headline(sluice_64: float, sluice_itl_64: float = 20.0, vllm_itl_64: float = 45.0) -> list[Point]:
    return [
        point(SLUICE, 1, 300),
        point(SLUICE, 64, sluice_64, itl_p95_ms=sluice_itl_64),
        point(VLLM, 1, 250),
        # vLLM's 64 misses the TTFT bound (and by default the ITL bound): its goodput is 250.
        point(VLLM, 64, 2_000, ttft_p95_ms=800.0, itl_p95_ms=vllm_itl_64),
    ]


def verdicts(lines: list[str]) -> dict[str, str]:
    """Each target line's verdict, by the line's start."""
    out = {}
    for line in lines:
        for key in ("goodput at least", "throughput never falls", "at 64 streams"):
            if line.startswith(f"- {key}"):
                out[key] = line.split("\n")[0].rsplit(": ", 1)[-1]
    return out


def test_the_targets_read_met_when_sluice_is_far_enough_ahead() -> None:
    lines = target_lines(headline(2_800), SLO, 0.05)
    assert verdicts(lines) == {"goodput at least": "**met**", "throughput never falls": "**met**",
                               "at 64 streams": "**met**"}  # fmt: skip
    text = "\n".join(lines)
    assert "goodput Sluice (safety none) / vLLM: 11.20x" in text  # 2,800 over vLLM's 250
    assert "1.40x (2,800 vs 2,000 tok/s)" in text


def test_a_ratio_decided_by_one_sides_ttft_tail_alone_is_not_met() -> None:
    # vLLM's 64 misses only the TTFT bound (a stall of a shared machine or its client, say): on the ITL
    # SLO alone its goodput is 2,000, and Sluice's 2,800 is 1.4x that, not 2x.
    lines = target_lines(headline(2_800, vllm_itl_64=30.0), SLO, 0.05)
    text = "\n".join(lines)
    assert "goodput Sluice (safety none) / vLLM: 11.20x" in text
    assert "on the ITL SLO alone (TTFT p95 not bounded)" in text and "ratio 1.40x" in text
    assert "(full SLO **met**, ITL alone **not met**)" in text
    assert next(line for line in lines if line.startswith("- goodput at least")).count("**not met**") == 2


def test_the_targets_read_not_met_and_say_where_it_falls() -> None:
    lines = target_lines(headline(250, sluice_itl_64=45.0), SLO, 0.05)
    # Sluice's 64 misses the ITL bound, so its goodput is 300 at 1 stream: 1.2x vLLM's 250.
    assert verdicts(lines) == {"goodput at least": "**not met**", "throughput never falls": "**not met**",
                               "at 64 streams": "**not met**"}  # fmt: skip
    assert "falls at 1 -> 64 streams: 250 tok/s, 16.7% below the best" in "\n".join(lines)


def test_a_fall_is_also_shown_round_by_round_against_the_same_round() -> None:
    """Three rounds, each a pass over 8, 32 and 64 streams: the medians put 64 7.8% under 32, but paired
    within their rounds (the same minutes of the machine) the drops are 4.2%, 0.7% and 7.8%."""
    per_round = {0: (3_300, 3_952, 3_787), 1: (3_200, 3_403, 3_379), 2: (3_400, 3_810, 3_513)}
    runs = [point(SLUICE, load, tps, round_index=r) for r, row in per_round.items()
            for load, tps in zip((8, 32, 64), row, strict=True)]  # fmt: skip
    drops = goodput_core.round_by_round_drops(runs, SLUICE, 64)
    assert [round(d, 3) for d in drops] == [0.042, 0.007, 0.078]
    assert goodput_core.round_by_round_drops(runs, SLUICE, 8) == []  # nothing at fewer streams
    points = [*goodput_core.median_points(runs), point(VLLM, 64, 1_000)]
    fall_line = next(line for line in target_lines(points, SLO, 0.05, runs=runs) if "falls at" in line)
    assert fall_line.endswith("round by round, below that round's best at fewer streams: 4.2%, 0.7%, 7.8% "
                              "(median 4.2%)")  # fmt: skip
    assert "round by round" not in "\n".join(target_lines(points, SLO, 0.05))  # no runs given: medians only


def test_no_ratio_without_both_targets_and_the_tables_rows() -> None:
    only = [point(SLUICE, 8, 1_000)]
    assert target_lines(only, SLO, 0.05)[-1].startswith("- Sluice (safety none) and vLLM did not both run")
    table = sweep_table([*headline(2_800), point(SLUICE, 8, 900, sweep=RATE)], CONCURRENCY, SLO)
    rows = table.splitlines()
    assert len(rows) == 2 + 4 and rows[0].startswith("| streams | target |")
    assert "| 64 | Sluice (safety none) | 10 | 0 | 2,800 |" in table and "| 1.40x | yes |" in table
    assert "| 64 | vLLM |" in table and table.count("| no |") == 1  # vLLM's 64: TTFT over the bound
    assert "sent late" in sweep_table([point(SLUICE, 8, 900, sweep=RATE)], RATE, SLO)


def test_every_run_and_every_warm_up_gets_a_fresh_seed() -> None:
    seeds = [goodput.point_seed(7, sweep, r, i) + warm for sweep in (CONCURRENCY, RATE) for r in range(5)
             for i in range(12) for warm in (0, goodput.WARM_UP_SEED_OFFSET)]  # fmt: skip
    assert len(set(seeds)) == len(seeds)


def test_each_round_passes_over_every_point_with_the_targets_in_turn() -> None:
    """Rounds outermost, so the machine's drift over a sweep falls on every point alike."""
    order = goodput.sweep_order(3, [SLUICE, VLLM], 2)
    assert order == [
        (0, 0, SLUICE), (0, 0, VLLM), (0, 1, SLUICE), (0, 1, VLLM), (0, 2, SLUICE), (0, 2, VLLM),
        (1, 0, SLUICE), (1, 0, VLLM), (1, 1, SLUICE), (1, 1, VLLM), (1, 2, SLUICE), (1, 2, VLLM),
    ]  # fmt: skip
    assert goodput.sweep_order(0, [SLUICE], 3) == []
    with pytest.raises(ValueError):
        goodput.sweep_order(3, [SLUICE, SLUICE], 1)


def test_quick_sizes_write_no_docs_and_the_seed_mix_is_1000_and_300(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_QUICK", "1")
    args = goodput.parse_args(["--write-docs", "--rates", "4"])
    assert (args.quick, args.write_docs, args.concurrency, args.rates) == (True, False, [1, 8], [4.0])
    monkeypatch.delenv("BENCH_QUICK")
    args = goodput.parse_args(["--mix", "seed", "--rounds", "1"])
    assert (args.prompt_len, args.output_len, args.rounds) == (1000, 300, 1)
    assert args.concurrency == [1, 2, 4, 8, 16, 32, 64] and args.rates == [4, 8, 16, 32, 48, 64]
    with pytest.raises(SystemExit):
        goodput.parse_args(["--concurrency", "--rates"])  # nothing to run


def test_the_bench_tenants_have_no_limits_and_the_measured_one_no_screen() -> None:
    (acme, acme_key), (none, none_key) = goodput.goodput_tenants()
    assert (acme.tenant_id, acme_key, acme.safety_policy) == ("acme", "sk-acme-dev", "pii")
    assert (none.tenant_id, none_key, none.safety_policy) == ("bench-none", "sk-bench-none", "none")
    for tenant in (acme, none):
        assert tenant.tokens_per_minute is None and tenant.max_concurrent_requests is None


def test_the_plot_is_drawn(tmp_path: Path) -> None:
    path = goodput.sweep_plot(headline(2_800), CONCURRENCY, tmp_path / "g.png", SLO, "title")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_the_docs_section_and_plots_render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    img = tmp_path / "docs" / "img"
    monkeypatch.setattr(goodput, "IMG", img)
    monkeypatch.setattr(goodput, "REPO_ROOT", tmp_path)
    args = goodput.parse_args(["--rounds", "2", "--section", "gp-mix"])
    setup = goodput.Setup("http://s", "http://v", {SLUICE: "k", VLLM: "k"}, "m", 10, [3], "bfloat16", 512,
                          {SLUICE: "Sluice x", VLLM: "vLLM y"}, {})  # fmt: skip
    points = [*headline(2_800), point(SLUICE, 8, 900, sweep=RATE), point(VLLM, 8, 800, sweep=RATE)]
    goodput.save_plots(points, points, SLO, "cmd", "gp-mix")
    # Named by the section: another section's plots are never overwritten.
    assert (img / "gp-mix-concurrency.png").exists() and (img / "gp-mix-rate.json").exists()
    text = goodput.report(setup, args, points, SLO, ".venv/bin/python -m bench.goodput --rounds 2")
    assert "- Sluice x." in text and "- vLLM y." in text and "the median over the rounds" in text
    assert "Concurrency sweep (closed loop):" in text and "Request-rate sweep (open loop, Poisson):" in text
    assert "goodput at least 2x vLLM's, on the full SLO and on the ITL SLO alone: **met**" in text
    assert "](img/gp-mix-concurrency.png)" in text and "](img/gp-mix-rate.png)" in text


def test_each_mix_and_kind_of_cpu_has_its_own_section() -> None:
    # A run on one machine must not overwrite another's: the Zen 1 EPYC's once replaced the Zen 3's.
    zen1, zen3 = "AMD EPYC family 23, 2 cores, no AVX-512", "AMD EPYC family 25, 2 cores, no AVX-512"
    assert goodput.default_section("random", zen1) == "goodput-amd-epyc-family-23-2-cores-no-avx-512"
    assert goodput.default_section("seed", zen1) == "goodput-seed-mix-amd-epyc-family-23-2-cores-no-avx-512"
    assert goodput.default_section("random", zen3) != goodput.default_section("random", zen1)
    assert goodput.parse_args(["--mix", "seed"]).section.startswith("goodput-seed-mix-")
    assert goodput.parse_args(["--section", "gp-mix"]).section == "gp-mix"
