"""``make bench`` (bench/all.py): its list covers every benchmark in bench/, a failing benchmark is reported
and the run goes on, the overview lands at the top of the docs with a reading of each plot; and the
cancel-to-free benchmark, its measurement against a stub and at a tiny size against a real stack."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from bench import all as runner
from bench import cancel_bench, overview, plots
from bench.cancel_bench import CancelSample, ReplicaState, parse_replica_state, wait_freed

DOCS = """# Benchmarks

Every figure here is printed by a script.

## CPU engine alone (issue 2)

old figures
<!-- BEGIN engine -->
table
<!-- END engine -->
"""


def test_every_benchmark_with_a_main_has_an_entry(tmp_path: Path) -> None:
    assert runner.unlisted() == []
    # A new benchmark without an entry is found (so the line above can fail).
    (tmp_path / "new_bench.py").write_text("def main() -> None:\n    pass\n")
    (tmp_path / "helpers.py").write_text("def helper() -> None:\n    pass\n")
    assert runner.unlisted(tmp_path) == ["bench.new_bench"]
    assert len({b.name for b in runner.BENCHES}) == len(runner.BENCHES)


@pytest.mark.parametrize("quick", [False, True])
def test_every_command_is_filled_in(quick: bool) -> None:
    values = {"base_url": "http://127.0.0.1:1", "grpc_url": "127.0.0.1:2", "metrics_url": "m",
              "telemetry": "t.jsonl", "sim_out": "out"}  # fmt: skip
    for bench in runner.BENCHES:
        argv = runner.command_of(bench, quick, values)
        assert not any("{" in a for a in argv), argv
        assert ("--write-docs" in argv) is (not quick and bench.module not in WRITES_NOTHING), bench.name
        if bench.needs_stack:
            assert any(a.startswith("http://127.0.0.1:1") for a in argv), bench.name


# Benchmarks that only print: nothing of theirs is written into the docs.
WRITES_NOTHING = {"bench.attention_bench", "bench.linear_bench", "bench.replica_bench", "bench.e2e_bench",
                  "control_plane.sim.cli"}  # fmt: skip


def test_a_failing_benchmark_is_reported_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text(DOCS)
    benches = (
        runner.Bench("broken", "bench.no_such_benchmark", (), (), 0.1),
        runner.Bench("fine", "this", (), (), 0.1),  # prints the Zen of Python, exit status 0
    )
    monkeypatch.setattr(runner, "BENCHES", benches)
    monkeypatch.setattr(runner, "RUNS", tmp_path / "img" / "bench-runs.json")
    monkeypatch.setattr(runner, "DOCS", docs)
    assert runner.main([]) == 1
    text = docs.read_text()
    assert "| broken |" in text and "failed (exit status 1)" in text
    assert "| fine |" in text and "| ok |" in text
    # A quick (smoke) run reports the same on stdout and leaves the docs alone.
    before = docs.read_text()
    monkeypatch.setenv("BENCH_QUICK", "1")
    assert runner.main([]) == 1
    assert docs.read_text() == before
    monkeypatch.delenv("BENCH_QUICK")
    # --only one of them keeps the other's last result.
    assert runner.main(["--only", "fine"]) == 0
    assert "failed (exit status 1)" in docs.read_text()
    # The overview alone, redrawn from the recorded runs: nothing runs.
    monkeypatch.setattr(runner, "run_one", None)
    assert runner.main(["--overview-only"]) == 0
    assert "failed (exit status 1)" in docs.read_text()


def test_the_overview_goes_at_the_top_and_is_replaced_in_place(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text(DOCS)
    overview.write_overview("## Overview\n\nfirst", docs)
    overview.write_overview("## Overview\n\nsecond", docs)
    text = docs.read_text()
    assert text.count("<!-- BEGIN overview -->") == 1 and "first" not in text
    assert text.index("Every figure here") < text.index("second") < text.index("## CPU engine alone")
    assert text.endswith("<!-- END engine -->\n") and "old figures" in text


def test_each_plot_is_drawn_and_read_from_its_numbers(tmp_path: Path) -> None:
    img = tmp_path / "img"
    samples = [CancelSample(float(ms), float(ms), 8) for ms in (10, 20, 30, 40)]
    samples.append(CancelSample(None, 5.0, 8))  # not freed in time
    cancel = {"samples": [s.__dict__ for s in samples]}
    plots.save_json(img / "cancel-to-free.png", cancel)
    plots.cancel_histogram([10.0, 20.0, 30.0, 40.0], img / "cancel-to-free.png", "test")
    runs = [{"target": t, "concurrency": c, "round_index": r, "ttft_p50_ms": 10.0 * c,
             "ttft_p95_ms": 20.0 * c, "itl_p50_ms": 1.0, "itl_p95_ms": 2.0 if t == "sluice" else 3.0,
             "tokens_per_s": 100.0 * c}
            for t in ("sluice", "vllm") for c in (1, 8) for r in (0, 1)]  # fmt: skip
    plots.save_json(img / "e2e-vs-vllm-sweep.png", {"runs": runs, "load": "load average 1 / 1 / 1"})
    plots.load_sweep(runs, img / "e2e-vs-vllm-sweep.png", "test")
    phases = {
        "unloaded": {"ttft_at_s": [0.1, 0.2], "ttft_ms": [10.0, 12.0],
                     "tokens_per_s": {"acme": 50.0, "globex": 0}},
        "during the flood": {"ttft_at_s": [0.1, 0.3], "ttft_ms": [40.0, 100.0],
                             "tokens_per_s": {"acme": 25.0, "globex": 75.0}},
    }  # fmt: skip
    plots.save_json(img / "noisy-tenant.png", {"phases": phases, "ttft_bound_ms": 250.0})
    plots.noisy_tenant(phases, img / "noisy-tenant.png", 250.0)
    for name in ("cancel-to-free", "e2e-vs-vllm-sweep", "noisy-tenant"):
        assert (img / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = "\n".join(overview.plot_lines(tmp_path))
    assert "freed on the replica 25 ms after" in text and "4 of 5 streams freed" in text
    assert "at 8 streams Sluice's TTFT p95 is 160 ms against vLLM's 160 ms, inter-token p95 2.0 ms" in text
    assert "goes from 12 ms alone to 97 ms while globex floods" in text and "25% of the output tokens" in text
    assert "**Simulator: steady**: not drawn yet." in text


def test_simulator_readings_cover_one_run_and_several(tmp_path: Path) -> None:
    run = {"ttft_p95_ms": 436.5, "utilisation": 0.612, "shed_rate": 0.0}
    checks = [{"target": "TTFT p95 < 500 ms", "met": True}, {"target": "no shed", "met": False}]
    (tmp_path / "img" / "sim").mkdir(parents=True)
    for scenario, data in (
        ("steady", {"replicas": 56, **run, "targets": {"checks": checks}}),
        ("noisy-tenant", {"replicas": 56, "wfq-noisy": run, "fcfs-noisy": {**run, "shed_rate": 0.338}}),
    ):
        (tmp_path / "img" / "sim" / f"{scenario}.png").write_bytes(b"png")
        plots.save_json(tmp_path / "img" / "sim" / f"{scenario}.png", data)
    text = "\n".join(overview.plot_lines(tmp_path))
    assert ("56 replicas, 1 of 2 targets met (not: no shed); TTFT p95 436 ms, utilisation 61%, shed 0.0%"
            in text)  # fmt: skip
    assert "wfq-noisy: TTFT p95 436 ms, utilisation 61%, shed 0.0%; fcfs-noisy: TTFT p95 436 ms" in text


def test_parse_replica_state_reads_the_engine_gauges() -> None:
    text = (
        "# HELP nv_trt_llm_request_metrics Requests\n"
        'nv_trt_llm_request_metrics{model="sluice-tiny",request_type="active",version="1"} 3\n'
        'nv_trt_llm_request_metrics{model="sluice-tiny",request_type="waiting",version="1"} 1\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="sluice-tiny",version="1"} 17\n'
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="sluice-tiny",version="1"} 239\n'
    )
    assert parse_replica_state(text) == ReplicaState(num_active=3, num_kv_blocks_used=17)
    with pytest.raises(ValueError, match="no engine gauges"):
        parse_replica_state("nv_inference_count 1\n")


def test_wait_freed_times_each_count_back_from_the_close() -> None:
    closed: list[bool] = []
    # After the close: the request count is back on the 3rd read, the KV blocks on the 5th.
    states = iter([ReplicaState(1, 5), ReplicaState(1, 5), ReplicaState(0, 5), ReplicaState(0, 4),
                   ReplicaState(0, 2)])  # fmt: skip

    async def close() -> None:
        closed.append(True)

    async def read_state() -> ReplicaState:
        assert closed, "read before the close"
        return next(states)

    sample = asyncio.run(wait_freed(close, read_state, ReplicaState(0, 2), 8, poll_s=0.01))
    assert sample.requests_freed_ms is not None and sample.kv_freed_ms is not None
    assert 10 <= sample.requests_freed_ms < sample.kv_freed_ms == sample.freed_ms

    async def never_freed() -> ReplicaState:
        return ReplicaState(1, 5)

    sample = asyncio.run(wait_freed(close, never_freed, ReplicaState(0, 2), 8, timeout_s=0.05))
    assert sample.freed_ms is None and sample.requests_freed_ms is None


@pytest.mark.slow
def test_cancel_bench_against_a_real_stack(dev_checkpoint: Path, tmp_path: Path) -> None:
    args = cancel_bench.parse_args(
        ["--streams", "2", "--tokens", "4", "--checkpoint", str(dev_checkpoint), "--work-dir", str(tmp_path)]
    )
    stack = cancel_bench.start_stack(args)
    try:
        assert stack.ports is not None
        samples = asyncio.run(cancel_bench.run(args, stack.base_url, stack.ports.metrics_url))
    finally:
        stack.stop()
    assert len(samples) == 2
    for sample in samples:
        assert sample.num_chunks_read == 4
        assert sample.freed_ms is not None and 0 < sample.freed_ms < args.timeout_s * 1000
    # What was timed is a cancellation, not a stream that ran to its end: the gateway recorded each of the
    # three (the warm-up too) as cancelled, short of the 512 tokens asked for.
    records = telemetry_records(tmp_path / "state" / "telemetry.jsonl", 3)
    assert [r["outcome"] for r in records] == ["cancelled"] * 3
    assert all(r["output_tokens"] < args.max_tokens for r in records)


def telemetry_records(path: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The first ``count`` records of the gateway's telemetry file, once its writer thread wrote them."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return [json.loads(line) for line in lines[:count]]
        time.sleep(0.1)


def test_the_goodput_headline_reads_each_servers_best_point_within_the_slo(tmp_path: Path) -> None:
    def run(target: str, streams: int, tok_s: float, ttft_p95: float, itl_p95: float) -> dict[str, object]:
        return {"target": target, "sweep": "concurrency", "load": streams, "round_index": 0,
                "requests": 8, "errors": 0, "tokens_per_s": tok_s, "ttft_p95_ms": ttft_p95,
                "itl_p95_ms": itl_p95}  # fmt: skip

    runs = [
        run("sluice", 8, 2_000.0, 300.0, 20.0),
        run("sluice", 64, 2_400.0, 2_000.0, 36.0),  # more tok/s, but past the TTFT bound
        run("vllm", 8, 1_000.0, 450.0, 8.0),
        run("vllm", 64, 1_500.0, 9_000.0, 20.0),
    ]
    slo = {"ttft_p95_ms": 500.0, "itl_p95_ms": 40.0}
    data = {"cpu": "Test CPU", "load": "load average 1 / 1 / 1", "slo": slo, "runs": runs}
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "goodput-concurrency.png").write_bytes(b"png")
    plots.save_json(tmp_path / "img" / "goodput-concurrency.png", data)
    text = "\n".join(overview.plot_lines(tmp_path))
    assert (
        "on Test CPU, closed-loop streams, within TTFT p95 <= 500 ms and ITL p95 <= 40 ms: Sluice "
        "2,000 tok/s at 8 streams against vLLM's 1,000 tok/s at 8 streams (2.00x); at 64 streams 2,400 "
        "against 1,500 tok/s, ITL p95 36.0 against 20.0 ms"
    ) in text
    assert text.index("Goodput beside vLLM") < text.index("Simulator: steady")  # the headline comes first


def test_every_kinds_of_cpu_plots_are_read_headline_first(tmp_path: Path) -> None:
    # bench.goodput and bench.e2e_side_by_side write one section and one plot per kind of CPU: the
    # overview reads each it finds, the 128/128 goodput before the seed's mix, and names the CPU.
    def goodput_run(target: str, tok_s: float) -> dict[str, object]:
        return {"target": target, "sweep": "concurrency", "load": 8, "round_index": 0, "requests": 8,
                "errors": 0, "tokens_per_s": tok_s, "ttft_p95_ms": 100.0, "itl_p95_ms": 20.0}  # fmt: skip

    slo = {"ttft_p95_ms": 500.0, "itl_p95_ms": 40.0}
    img = tmp_path / "img"
    img.mkdir()
    for name, cpu, sluice_tps in (
        ("goodput-seed-mix-avx2-concurrency", "CPU B", 300.0),
        ("goodput-avx2-concurrency", "CPU B", 1_200.0),
        ("goodput-concurrency", "CPU A", 2_000.0),
    ):
        (img / f"{name}.png").write_bytes(b"png")
        runs = [goodput_run("sluice", sluice_tps), goodput_run("vllm", 1_000.0)]
        plots.save_json(img / f"{name}.png", {"cpu": cpu, "slo": slo, "runs": runs})
    e2e = [{"target": t, "concurrency": 32, "round_index": 0, "ttft_p95_ms": 100.0, "itl_p95_ms": 20.0,
            "tokens_per_s": tps} for t, tps in (("sluice", 1_000.0), ("vllm", 500.0), ("engine", 2_000.0),
                                                ("engine-team", 1_250.0))]  # fmt: skip
    (img / "e2e-vs-vllm-cpu-b.png").write_bytes(b"png")
    plots.save_json(img / "e2e-vs-vllm-cpu-b.png", {"cpu": "CPU B", "runs": e2e})
    lines = [line for line in overview.plot_lines(tmp_path) if line.startswith("**")]
    assert [line.split(":", 1)[0] for line in lines[:4]] == [
        "**Goodput beside vLLM (issue 22's headline), 128/128**",
        "**Goodput beside vLLM (issue 22's headline), 128/128**",
        "**Goodput beside vLLM (issue 22's headline), the seed's mix (1,000-token prompts, 300 out)**",
        "**Beside vLLM and the engine alone (`make bench-e2e`)**",
    ]
    assert "on CPU B, closed-loop" in lines[0] and "(1.20x)" in lines[0]  # goodput-avx2 sorts first
    assert "on CPU A, closed-loop" in lines[1] and "(2.00x)" in lines[1]
    assert "Sluice 300 tok/s at 8 streams" in lines[2]
    assert lines[3].startswith(
        "**Beside vLLM and the engine alone (`make bench-e2e`)**: on CPU B: at 32 streams"
    )
    assert "the stack's share of the engine alone on every core 50%, on the replica's threads 80%" in lines[3]
    # Nothing drawn yet: the headline and the sweep are still listed, as not drawn.
    empty = overview.plot_lines(tmp_path / "none")
    assert empty[0] == "**Goodput beside vLLM (issue 22's headline)**: not drawn yet."
    assert "**Beside vLLM and the engine alone (`make bench-e2e`)**: not drawn yet." in empty
