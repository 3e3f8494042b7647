"""The side-by-side benchmark's pure parts (run order, seeds, medians, ratios, the table, the parsers of
what the replica exports) and its process clean-up on a real process tree. No server is started."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info
from tokenizers import Tokenizer

from bench.e2e_bench import Timeline, plain_prompt_ids, request_tpot_ms
from bench.e2e_side_by_side import engine_info, replica_prefill_threads, repository_parameters
from bench.engine_bench import engine_threads
from bench.report import describe_cpu, write_measured
from bench.servers import SluiceStack, VllmServer, is_alive, proc_id, process_tree, stop_tree
from bench.side_by_side import (
    ENGINE,
    ENGINE_TEAM,
    SLUICE,
    SLUICE_DEFAULT,
    VLLM,
    RunResult,
    alternation,
    comparison_table,
    medians,
    ratio,
    run_seed,
    target_lines,
)
from cpu_engine.native import elementwise_ext
from sluice.domain import Tenant
from sluice.safety.fold import fold
from sluice.safety.rules import pii_rules
from sluice.settings import Settings
from sluice.stores.openers import open_tenant_store
from sluice.stores.tenants.base import dev_tenant


def result(
    target: str, concurrency: int, round_index: int, tokens_per_s: float, latency_ms: float
) -> RunResult:
    return RunResult(target, concurrency, round_index, tokens_per_s, *([latency_ms] * 7))


def test_alternation_runs_every_target_once_per_round_in_order() -> None:
    assert alternation([SLUICE, VLLM], 3) == [
        (0, SLUICE),
        (0, VLLM),
        (1, SLUICE),
        (1, VLLM),
        (2, SLUICE),
        (2, VLLM),
    ]
    assert [t for _, t in alternation([SLUICE, VLLM, ENGINE], 2)] == [SLUICE, VLLM, ENGINE] * 2


@pytest.mark.parametrize(("targets", "num_rounds"), [([SLUICE], 0), ([], 1), ([SLUICE, SLUICE], 1)])
def test_alternation_refuses_an_empty_or_repeating_plan(targets: list[str], num_rounds: int) -> None:
    with pytest.raises(ValueError):
        alternation(targets, num_rounds)


def test_every_run_gets_a_fresh_seed_and_the_warm_up_its_own() -> None:
    seeds = [run_seed(7, r, c) for r in range(-1, 5) for c in (1, 8, 32, 128)]
    assert len(set(seeds)) == len(seeds)


def test_from_samples_reduces_a_run_to_its_percentiles() -> None:
    samples = [float(v) for v in range(1, 102)]
    r = RunResult.from_samples(SLUICE, 4, 0, 100.0, samples, [2.0] * 50, samples)
    assert (r.ttft_p50_ms, r.ttft_p95_ms) == (51.0, 96.0)
    assert (r.itl_p50_ms, r.itl_p95_ms, r.itl_p99_ms) == (2.0, 2.0, 2.0)
    assert (r.tpot_p50_ms, r.tpot_p95_ms) == (51.0, 96.0)


def test_tpot_is_the_pace_of_a_request_whatever_its_bursts() -> None:
    # 5 tokens: the first chunk at 1.0 s, then a burst of three chunks, then the last at 1.4 s.
    bursty = Timeline(0.9, [1.0, 1.3, 1.3, 1.3, 1.4], completion_tokens=5)
    assert request_tpot_ms(bursty) == pytest.approx(100.0)
    # Chunks of several tokens: tokens from usage, not chunks.
    assert request_tpot_ms(Timeline(0.0, [1.0, 1.8], completion_tokens=9)) == pytest.approx(100.0)
    assert request_tpot_ms(Timeline(0.0, [1.0], completion_tokens=1)) is None
    assert request_tpot_ms(Timeline(0.0, [], completion_tokens=4)) is None


def test_medians_are_per_target_and_concurrency() -> None:
    runs = [result(SLUICE, 32, i, v, v / 10) for i, v in enumerate([300.0, 100.0, 200.0])]
    runs.append(result(SLUICE, 1, 0, 999.0, 1.0))
    runs.append(result(VLLM, 32, 0, 50.0, 1.0))
    mid = medians(runs, SLUICE, 32)
    assert mid is not None
    assert (mid["tokens_per_s"], mid["itl_p99_ms"]) == (200.0, 20.0)
    assert medians(runs, ENGINE, 32) is None


def test_ratio_is_none_without_a_positive_denominator() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None
    assert ratio(3.0, None) is None
    assert ratio(3.0, 0.0) is None


def test_table_quotes_medians_ranges_and_ratios_of_the_medians() -> None:
    runs = [
        result(SLUICE, 32, 0, 1200.0, 40.0),
        result(SLUICE, 32, 1, 1000.0, 60.0),
        result(SLUICE, 32, 2, 1100.0, 50.0),
        result(VLLM, 32, 0, 500.0, 20.0),
        result(VLLM, 32, 1, 600.0, 30.0),
        result(VLLM, 32, 2, 550.0, 25.0),
        result(ENGINE, 32, 0, 2000.0, 5.0),
        result(ENGINE_TEAM, 32, 0, 1375.0, 8.0),
    ]
    runs.append(result(SLUICE_DEFAULT, 32, 0, 990.0, 100.0))
    lines = comparison_table(runs, [32]).splitlines()
    assert lines[0] == (
        "| streams | metric | Sluice (safety none) | Sluice (safety pii) | vLLM | Sluice / vLLM "
        "| pii / none | engine alone | Sluice / engine | engine alone, replica's threads | Sluice / that |"
    )
    assert len(lines) == 2 + 8  # header, rule, one row per metric
    assert lines[2] == (
        "| 32 | output tok/s | 1,100 (1,000-1,200) | 990 | 550 (500-600) | 2.00x | 0.90x | 2,000 | 55% "
        "| 1,375 | 80% |"
    )
    # Latency rows: the ratio of the medians, and no share of either engine (only throughput has one).
    assert lines[5] == (
        "| 32 | ITL p50 ms | 50.00 (40.00-60.00) | 100.00 | 25.00 (20.00-30.00) | 2.00x | 2.00x | 5.00 | - "
        "| 8.00 | - |"
    )


def test_a_metric_a_target_does_not_measure_is_a_dash_not_nan() -> None:
    # The engine alone has no per-request time per token; one Sluice run lacks it too.
    runs = [
        RunResult.from_samples(SLUICE, 8, 0, 900.0, [10.0], [1.0], [4.0]),
        RunResult.from_samples(SLUICE, 8, 1, 1100.0, [10.0], [1.0], []),
        RunResult.from_samples(VLLM, 8, 0, 500.0, [10.0], [1.0], [2.0]),
        RunResult.from_samples(ENGINE, 8, 0, 2000.0, [1.0], [0.5]),
    ]
    tpot_row = comparison_table(runs, [8]).splitlines()[-2]
    assert tpot_row == "| 8 | TPOT p50 ms | 4.00 | - | 2.00 | 2.00x | - | - | - | - | - |"
    assert target_lines(runs, 8)[-2].endswith("Sluice / vLLM p50 2.00x, p95 2.00x")
    assert target_lines(runs, 8)[-1].endswith("tok/s -, TTFT p95 -, ITL p95 -, TPOT p95 -")


def test_table_leaves_a_dash_where_a_target_did_not_run() -> None:
    lines = comparison_table([result(SLUICE, 1, 0, 300.0, 2.0)], [1, 8]).splitlines()
    assert lines[2] == "| 1 | output tok/s | 300 | - | - | - | - | - | - | - | - |"
    assert lines[10] == "| 8 | output tok/s | - | - | - | - | - | - | - | - | - |"


def test_targets_are_read_off_the_medians() -> None:
    runs = [
        RunResult(SLUICE, 32, 0, 1600.0, 100.0, 200.0, 10.0, 15.0, 30.0),
        RunResult(VLLM, 32, 0, 800.0, 150.0, 400.0, 9.0, 20.0, 25.0),
        RunResult(ENGINE, 32, 0, 2000.0, 20.0, 50.0, 3.0, 9.0, 12.0),
    ]
    lines = target_lines(runs)
    assert lines[1].endswith("80% (at least 75%): met")
    assert lines[2].endswith("0.75x (at most 1x): met")
    assert lines[3].endswith("1.50x (under 2x): met")
    assert lines[4].endswith("tok/s 2.00x, TTFT p95 0.50x (above 1x and below 1x): met")
    slow = [RunResult(SLUICE, 32, 0, 1400.0, 100.0, 500.0, 10.0, 25.0, 30.0), *runs[1:]]
    assert [line.rsplit(": ", 1)[1] for line in target_lines(slow)[1:5]] == ["not met"] * 4
    assert target_lines(runs[1:]) == []
    assert target_lines(runs[:1])[1].endswith("not measured")


def test_the_share_is_judged_again_against_the_engine_on_the_replicas_threads() -> None:
    # The engine on every core makes 2,000 tok/s, on the replica's one decode thread 1,250: a stack at
    # 1,000 serves 50% of the first (not met) and 80% of the second (met), and both are said.
    runs = [result(SLUICE, 32, 0, 1000.0, 20.0), result(ENGINE, 32, 0, 2000.0, 5.0)]
    runs.append(result(ENGINE_TEAM, 32, 0, 1250.0, 8.0))
    lines = target_lines(runs)
    assert lines[1].endswith("50% (at least 75%): not met")
    assert (
        lines[5] == "- served share of the engine alone on the replica's own threads 80% (at least 75%): met"
    )
    slow = [result(SLUICE, 32, 0, 900.0, 20.0), *runs[1:]]
    assert target_lines(slow)[5].endswith("72% (at least 75%): not met")
    assert target_lines(runs[:2])[5].endswith("threads - (at least 75%): not measured")


def test_targets_are_judged_on_sluice_without_the_screen_and_the_screen_is_costed() -> None:
    runs = [
        RunResult(SLUICE, 32, 0, 1600.0, 100.0, 200.0, 10.0, 15.0, 30.0, 8.0, 10.0),
        RunResult(SLUICE_DEFAULT, 32, 0, 1600.0, 100.0, 300.0, 1.0, 45.0, 90.0, 8.0, 12.0),
        RunResult(VLLM, 32, 0, 800.0, 150.0, 400.0, 9.0, 20.0, 25.0, 8.0, 10.0),
        RunResult(ENGINE, 32, 0, 2000.0, 20.0, 50.0, 3.0, 9.0, 12.0),
    ]
    lines = target_lines(runs)
    assert "safety policy none" in lines[0]
    assert [line.rsplit(": ", 1)[1] for line in lines[1:5]] == ["met"] * 4  # the default's ITL is not judged
    assert lines[-1] == (
        "- the pii safety policy's cost (pii / none): tok/s 1.00x, TTFT p95 1.50x, ITL p95 3.00x, "
        "TPOT p95 1.20x"
    )
    # Only the screened target ran (a reused stack without a key for policy none): nothing is judged.
    assert target_lines(runs[1:]) == []


def test_engine_info_reads_the_labels_of_the_replicas_gauge() -> None:
    text = (
        "# HELP sluice_engine_info The engine's dtype and CPU\n# TYPE sluice_engine_info gauge\n"
        'sluice_engine_info{model="sluice-tiny",dtype="float32",requested_dtype="auto",'
        'cpu_flags="avx2 fma",bf16_kernel="portable"} 1.0\n'
    )
    info = engine_info(text)
    assert info["dtype"] == "float32" and info["cpu_flags"] == "avx2 fma"
    assert engine_info("nv_inference_count 3\n") == {}


def test_repository_parameters_reads_the_rendered_config(tmp_path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.pbtxt").write_text(
        'parameters: { key: "step_token_budget" value: { string_value: "512" } }\n'
        'parameters: { key: "dtype" value: { string_value: "auto" } }\n'
    )
    assert repository_parameters(tmp_path, "m") == {"step_token_budget": "512", "dtype": "auto"}
    assert repository_parameters(tmp_path, "absent") == {}


def test_the_replicas_prefill_team_is_read_as_the_model_reads_it() -> None:
    assert replica_prefill_threads({"prefill_num_threads": "auto"}) == len(os.sched_getaffinity(0))
    assert replica_prefill_threads({"prefill_num_threads": "3"}) == 3
    assert replica_prefill_threads({"prefill_num_threads": ""}) is None  # every step on the decode team
    assert replica_prefill_threads({}) is None  # a repository rendered before the parameter


def test_the_engine_alone_runs_on_the_team_asked_for_and_the_team_is_put_back() -> None:
    before = elementwise_ext.get_max_threads()
    asked = before + 2  # not the default, whatever this machine's cores
    with engine_threads(asked):
        assert elementwise_ext.get_max_threads() == asked
    assert elementwise_ext.get_max_threads() == before
    with pytest.raises(RuntimeError), engine_threads(asked):
        raise RuntimeError("a run that fails")
    assert elementwise_ext.get_max_threads() == before
    with engine_threads(None):
        assert elementwise_ext.get_max_threads() == before
    # numpy's BLAS pool too (the float32 layers' prefill products): a replica's follows its OMP_NUM_THREADS.
    blas_before = _blas_threads()
    with engine_threads(1):
        assert _blas_threads() == 1 and elementwise_ext.get_max_threads() == 1
    assert _blas_threads() == blas_before


def _blas_threads() -> int:
    (blas,) = (pool for pool in threadpool_info() if pool["user_api"] == "blas")
    return int(blas["num_threads"])


def test_stop_tree_kills_a_tree_that_ignores_the_polite_signal() -> None:
    # A root that ignores SIGINT (as a hung server would) with a child of its own.
    proc = subprocess.Popen(
        ["bash", "-c", "trap '' INT; sleep 30 & wait"], start_new_session=True, stdin=subprocess.DEVNULL
    )
    root = proc_id(proc.pid)
    assert root is not None
    deadline = time.monotonic() + 5
    while len(tree := process_tree(root)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(tree) == 2
    killed = stop_tree(root, signal.SIGINT, 0.3, lambda: None)
    proc.wait(5)
    assert set(killed) == set(tree)
    assert not any(is_alive(p) for p in tree)


def test_stop_tree_lets_a_polite_process_exit_on_its_own() -> None:
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    root = proc_id(proc.pid)
    assert root is not None
    assert stop_tree(root, signal.SIGTERM, 5.0, proc.poll) == []
    assert proc.wait(5) == -signal.SIGTERM


def test_vllm_is_installed_once_and_pip_index_warnings_are_dropped(tmp_path, capfd) -> None:
    anchor = tmp_path / "anchor"
    anchor.mkdir()
    (anchor / "install.sh").write_text(
        "set -e\necho \"WARNING: Location 'file:///opt/pypi/simple/x/' is ignored\"\necho installed-once\n"
        'mkdir -p "$1/venv/bin" && touch "$1/venv/bin/vllm"\n'
    )
    server = VllmServer(tmp_path / "vllm", tmp_path / "ckpt", 8011, anchor_dir=anchor)
    server.ensure_installed()
    server.ensure_installed()  # already there: install.sh does not run again
    err = capfd.readouterr().err
    assert err.count("installed-once") == 1
    assert "WARNING: Location" not in err


def test_a_failed_install_is_an_error(tmp_path) -> None:
    (tmp_path / "install.sh").write_text("exit 3\n")
    with pytest.raises(RuntimeError, match="exit status 3"):
        VllmServer(tmp_path / "vllm", tmp_path, 8011, anchor_dir=tmp_path).ensure_installed()


def test_served_prompts_cannot_trip_the_pii_screen(dev_checkpoint) -> None:
    # A random prompt over the whole vocabulary sometimes spells a Luhn-valid card number, which
    # Sluice's default policy answers with 400 and the run would end; vLLM gets the same prompts.
    ids = plain_prompt_ids(dev_checkpoint)
    tokenizer = Tokenizer.from_file(str(dev_checkpoint / "tokenizer.json"))
    assert 7000 < len(ids) < 8192 and min(ids) >= 3  # special tokens and digit-bearing ones left out
    rng = np.random.default_rng(0)
    rules = pii_rules(email=True, card=True, ssn=True)
    for _ in range(300):
        text = fold(tokenizer.decode(rng.choice(ids, 128).tolist()))
        assert not any(ch.isdigit() or ch == "@" for ch in text)
        assert all(rule.first_match(text) is None for rule in rules)


def test_a_measured_section_names_its_command_and_replaces_only_itself(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# Benchmarks\n\n<!-- BEGIN other -->\nkept\n<!-- END other -->\n")
    write_measured("mine", "python -m bench.x --write-docs", ["| a |", "| 1 |"], docs)
    write_measured("mine", "python -m bench.x --write-docs", ["| a |", "| 2 |"], docs)
    text = docs.read_text()
    assert "kept" in text and text.count("<!-- BEGIN mine -->") == 1
    assert "```\npython -m bench.x --write-docs\n```" in text and "| 2 |" in text and "| 1 |" not in text


def test_the_stack_gets_its_tenant_with_policy_none_in_its_own_state_dir(tmp_path: Path) -> None:
    stack = SluiceStack(Path("repo"), "http://127.0.0.1:1", tmp_path / "log", state_dir=tmp_path / "state")
    tenant = dataclasses.replace(dev_tenant("bench-none"), safety_policy="none")
    stack.put_tenant(tenant, "sk-bench-none")
    stack.put_tenant(tenant, "sk-bench-none")  # a second run finds it there: the same tenant and key

    async def resolve() -> Tenant | None:
        store = await open_tenant_store(Settings(state_dir=tmp_path / "state"))
        try:
            return await store.resolve("sk-bench-none")
        finally:
            await store.close()

    assert asyncio.run(resolve()) == tenant
    assert (tmp_path / "state" / "sluice.db").exists()


def test_the_cpu_description_tells_the_epyc_generations_apart() -> None:
    # The sections are named by it: a Zen 1 EPYC's run must not overwrite a Zen 3's (both "AMD EPYC" in a VM).
    def lscpu(name: str, family: str, flags: str) -> dict[str, str]:
        return {
            "Model name": f"    {name}",
            "CPU family": f"   {family}",
            "CPU(s)": " 2",
            "Flags": f" fpu {flags}",
        }

    assert describe_cpu(lscpu("AMD EPYC", "23", "avx2 fma")) == "AMD EPYC family 23, 2 cores, no AVX-512"
    assert describe_cpu(lscpu("AMD EPYC", "25", "avx2 fma")) == "AMD EPYC family 25, 2 cores, no AVX-512"
    zen4 = describe_cpu(lscpu("AMD EPYC", "25", "avx2 avx512f avx512_bf16"))
    assert zen4 == "AMD EPYC family 25, 2 cores, AVX-512 BF16"
    # A name that carries its model keeps it as it is; Intel's family (6) says nothing.
    assert (
        describe_cpu(lscpu("AMD EPYC 7R13 Processor", "25", "avx2"))
        == "AMD EPYC 7R13 Processor, 2 cores, no AVX-512"
    )
    xeon = describe_cpu(lscpu("Intel(R) Xeon(R) Processor", "6", "avx512f avx512_bf16 amx_tile"))
    assert xeon == "Intel(R) Xeon(R) Processor, 2 cores, AVX-512 BF16"
    assert describe_cpu({}) == "?, ? cores, no AVX-512"
