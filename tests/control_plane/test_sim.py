"""The fleet simulator (control_plane/sim): the calibration's anchors, one replica alone, and small,
scaled-down runs of every scenario through the real admission, quota, queue and dispatch policies."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from control_plane.sim import cli
from control_plane.sim.calibration import seed_calibration
from control_plane.sim.progress import ProgressLines, Tick
from control_plane.sim.replica import Replica, ReplicaConfig
from control_plane.sim.scenarios import Options, run_scenario, tenants_for
from control_plane.sim.targets import judge
from control_plane.sim.workload import Outcome, SimRequest
from sluice.domain import RequestClass

# 20 requests/s on 4 replicas: the seed's load scaled down 14x, over 30 simulated seconds.
SMALL = Options(replicas=4, duration_s=30.0, rate_per_s=20.0, num_noisy_requests=300)


def test_calibration_decode_anchor_is_the_seeds_2000_tokens_per_s() -> None:
    cal = seed_calibration()
    assert cal.weights_bytes_per_gpu == pytest.approx(17.5e9)
    assert cal.bandwidth_bytes_per_s == pytest.approx(645.5e9)
    step_s = cal.step_time_s(80, 80 * 1_300)  # 80 sequences of 1 300 tokens, decoding
    assert step_s == pytest.approx(0.040)
    assert 80 / step_s == pytest.approx(2_000.0)


def test_calibration_prefill_anchor_is_the_seeds_10k_tokens_per_s() -> None:
    cal = seed_calibration()
    num_tokens = 8_192  # one big prefill: compute-bound
    assert num_tokens / cal.step_time_s(num_tokens, num_tokens) == pytest.approx(10_000.0)
    assert 600_000 <= cal.kv_capacity_tokens <= 700_000  # "~700 k tokens", ~500 sequences of 1 300


def _request(prompt_tokens: int, max_tokens: int) -> SimRequest:
    return SimRequest("r1", "t0", RequestClass.INTERACTIVE, prompt_tokens, max_tokens, 0.0, 15.0)


def test_one_sequence_alone_prefills_in_chunks_then_decodes_exactly_max_tokens() -> None:
    cal = seed_calibration()
    replica = Replica("r0", cal, ReplicaConfig(step_token_budget=512, step_time_cap_s=None))
    request = _request(1_000, 5)
    replica.submit(request)
    assert replica.load().free_kv_tokens == cal.kv_capacity_tokens - 1_005
    assert replica.load().num_waiting == 1
    now_s, num_emitted, ttft_s = 0.0, 0, None
    finished: list[SimRequest] = []
    while (duration_s := replica.start_step()) is not None:
        now_s += duration_s
        result = replica.end_step()
        num_emitted += result.num_decode_tokens + len(result.first_tokens)
        if result.first_tokens:
            ttft_s = now_s
        finished += result.finished
    prefill_steps_s = cal.step_time_s(512, 512) + cal.step_time_s(488, 1_000)
    assert ttft_s == pytest.approx(prefill_steps_s)  # two chunks: 512 + 488, the second emits token 1
    assert num_emitted == 5 and finished == [request]
    assert replica.num_steps == 2 + 4
    assert replica.load().free_kv_tokens == cal.kv_capacity_tokens  # KV returned in full
    assert replica.load().num_running == 0 and not replica.busy


def test_the_step_time_cap_shrinks_prefill_chunks_while_sequences_decode() -> None:
    cal = seed_calibration()
    replica = Replica("r0", cal, ReplicaConfig(step_token_budget=512, step_time_cap_s=0.038))
    for i in range(3):
        request = _request(1_000, 50)
        request.request_id = f"r{i}"
        replica.submit(request)
    longest_s = 0.0
    while (duration_s := replica.start_step()) is not None:
        if replica.num_decoding > 0:
            longest_s = max(longest_s, duration_s)
        replica.end_step()
    assert 0 < longest_s <= 0.038 + 1e-9


def _summary(tmp_path: Path, scenario: str, options: Options = SMALL) -> dict:
    summary = run_scenario(scenario, options, tmp_path)
    assert (tmp_path / f"{scenario}.json").exists()
    assert (tmp_path / f"{scenario}.png").stat().st_size > 0
    assert json.loads((tmp_path / f"{scenario}.json").read_text()) == json.loads(json.dumps(summary))
    return summary


def test_steady_searches_replicas_from_the_roofline_bound(tmp_path: Path) -> None:
    summary = _summary(tmp_path, "steady", Options(duration_s=30.0, rate_per_s=20.0))
    found = summary["replica_search"]["found"]
    assert summary["lower_bound_replicas"] <= found == summary["replicas"]
    assert summary["meets_targets"]
    assert summary["ttft_p95_ms"] < 500 and summary["itl_p95_ms"] < 40
    assert summary["outcomes"] == {"finished": summary["num_arrived"]}
    assert 0 < summary["utilisation"] < 1


def test_doubling_refuses_with_retry_after_and_serves_nothing_late(tmp_path: Path) -> None:
    summary = _summary(tmp_path, "doubling")
    assert summary["interactive_served_past_deadline"] == 0
    assert summary["shed_rate"] > 0  # twice the load on a fleet sized for once
    assert summary["every_refusal_has_retry_after"]


def test_noisy_tenant_hurts_others_less_under_wfq_than_fcfs(tmp_path: Path) -> None:
    summary = _summary(tmp_path, "noisy-tenant")
    others = summary["others_ttft_p95_ms"]
    assert others["wfq-noisy"] < others["fcfs-noisy"]
    rise = summary["others_ttft_p95_rise"]
    assert rise["wfq"] < 0.25 < rise["fcfs"]  # at full scale: +3% against +320% (docs/simulator.md)
    assert summary["wfq-noisy"]["noisy_outcomes"]  # the burst arrived


def test_batch_fill_raises_utilisation_and_holds_itl(tmp_path: Path) -> None:
    summary = _summary(tmp_path, "batch-fill")
    assert summary["utilisation"] > 0.7
    assert summary["itl_p95_ms"] < 40
    assert summary["outcomes"].get("open", 0) > 0  # a standing backlog at the end


def test_every_arrival_ends_exactly_once() -> None:
    from control_plane.sim.scenarios import interactive_stream, run_fleet

    options = SMALL
    tenants = tenants_for(options)
    stream = interactive_stream(options, tenants, rate_steps=((10.0, 3.0),))  # overload: refusals too
    run = run_fleet(options, 3, tenants, [stream])
    ids = [r.request_id for r in run.requests]
    assert len(ids) == len(set(ids)) > 0
    counts = {o: 0 for o in Outcome}
    for r in run.requests:
        assert r.outcome is not None
        counts[r.outcome] += 1
        if r.outcome in (Outcome.REFUSED, Outcome.DROPPED):
            assert r.dispatch_s is None  # never reached a replica
        if r.outcome is Outcome.REFUSED:
            assert r.reason and r.retry_after_s is not None and r.retry_after_s > 0
        if r.outcome is Outcome.DROPPED:
            assert r.reason == "deadline_at_head" and r.retry_after_s is None and r.first_token_s is None
        if r.outcome is Outcome.FINISHED:
            assert r.first_token_s is not None and r.finish_s is not None
    assert counts[Outcome.OPEN] == 0  # the drain let everything in flight finish
    assert counts[Outcome.REFUSED] > 0 and counts[Outcome.FINISHED] > 0
    assert sum(counts.values()) == len(run.requests)
    emitted = sum(run.step_num_emitted)
    assert math.isclose(emitted, sum(r.max_tokens for r in run.requests if r.outcome is Outcome.FINISHED))


def test_same_seed_same_summary(tmp_path: Path) -> None:
    first = run_scenario("doubling", SMALL, tmp_path / "a")
    again = run_scenario("doubling", SMALL, tmp_path / "b")
    other = run_scenario("doubling", Options(**{**SMALL.__dict__, "seed": 1}), tmp_path / "c")
    assert (tmp_path / "a" / "doubling.json").read_text() == (tmp_path / "b" / "doubling.json").read_text()
    assert first == again
    assert other["num_arrived"] != first["num_arrived"] or other["ttft_p95_ms"] != first["ttft_p95_ms"]


# ----- what the terminal shows (`sluice sim`): progress, the summary table, the targets, --json -----
# 4 replicas at 20 requests/s over 15 simulated seconds: about 1 s of wall time per run.
CLI_SMALL = ["--replicas", "4", "--duration-s", "15", "--rate-per-s", "20"]
TABLE_HEADERS = [
    "scenario",
    "replicas",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "ITL p50 ms",
    "ITL p95 ms",
    "utilisation",
    "shed",
    "$/M out tokens",
    "targets",
]


def _sim(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[str, str]:
    assert cli.main([*args, *CLI_SMALL, "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def _cells(line: str) -> list[str]:
    """A rendered table line's cells: columns are separated by two or more spaces."""
    return [cell for cell in line.split("  ") if cell.strip()] if line else []


def _table(out: str) -> list[dict[str, str]]:
    lines = out.splitlines()
    headers = [c.strip() for c in _cells(lines[0])]
    rows = []
    for line in lines[1:]:
        if not line:
            break
        rows.append(dict(zip(headers, [c.strip() for c in _cells(line)], strict=True)))
    return rows


def test_sim_prints_progress_on_stderr_then_the_table_the_targets_and_the_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = _sim(tmp_path, capsys, "--scenario", "doubling")
    assert out.splitlines()[0].split() == " ".join(TABLE_HEADERS).split()
    [row] = _table(out)
    summary = json.loads((tmp_path / "doubling.json").read_text())
    assert summary["targets"]["met"] is True  # the doubling's targets hold even on this small fleet
    assert row["scenario"] == "doubling" and row["replicas"] == "4" and row["targets"] == "met"
    assert row["TTFT p95 ms"] == f"{summary['ttft_p95_ms']:,.0f}"
    assert row["ITL p50 ms"] == f"{summary['itl_p50_ms']:.1f}"
    assert row["shed"] == f"{summary['shed_rate']:.2%}" and row["shed"] != "0.00%"
    assert row["$/M out tokens"] == f"${summary['cost_per_m_output_tokens_usd']:,.2f}"
    assert "interactive finished past deadline = 0" in out and "every refusal has a Retry-After" in out
    assert out.rstrip().splitlines()[-1].startswith(f"wrote {tmp_path / 'doubling.json'} and ")
    progress = err.splitlines()  # stderr has the progress lines only
    assert [line.split("]")[0] for line in progress] == ["[sim doubling"] * 10
    percents = [int(line.split("] ")[1].split("%")[0]) for line in progress]
    # one line at the first sample (every simulated second) at or past each tenth: 1.5 s -> t=2 s, 13 %
    assert [p // 10 for p in percents] == list(range(1, 11)) and percents[0] == 13
    assert progress[-1].startswith("[sim doubling] 100% (t=15 s of 15): ")
    assert " requests, queue " in progress[-1] and progress[-1].endswith(", replicas 4")


def test_a_missed_target_shows_not_met_and_which_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = _sim(tmp_path, capsys, "--scenario", "steady", "--quiet")
    [row] = _table(out)
    assert row["targets"] == "not met"  # 4 replicas are too few for TTFT p95 < 500 ms after the start
    targets = _table(out.split("\n\n")[1])
    by_target = {t["targets"]: t for t in targets}
    assert by_target["TTFT p95 < 500 ms"]["met"] == "not met"
    assert by_target["ITL p95 < 40 ms"]["met"] == "met"


def test_quiet_prints_no_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, err = _sim(tmp_path, capsys, "--scenario", "steady", "--quiet", "--duration-s", "6")
    assert err == ""


def test_json_prints_the_tables_figures_and_nothing_else_on_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = _sim(tmp_path, capsys, "--scenario", "noisy-tenant", "--json")
    printed = json.loads(out)  # stdout is the JSON alone
    summary = json.loads((tmp_path / "noisy-tenant.json").read_text())
    assert [(r["scenario"], r["run"]) for r in printed["rows"]] == [
        ("noisy-tenant", "wfq-baseline"),
        ("noisy-tenant", "wfq-noisy"),
        ("noisy-tenant", "fcfs-noisy"),
    ]
    verdict = "met" if summary["targets"]["met"] else "not met"
    assert [r["targets"] for r in printed["rows"]] == [None, verdict, None]  # only wfq-noisy is judged
    for row in printed["rows"]:
        run = summary[row["run"]]
        for key in ("replicas", "ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms", "utilisation"):
            assert row[key] == run[key]
        assert row["shed_rate"] == run["shed_rate"]
        assert row["cost_per_m_output_tokens_usd"] == run["cost_per_m_output_tokens_usd"]
    assert printed["targets"] == summary["targets"]
    [check] = printed["targets"]["checks"]
    assert check["value"] == summary["others_ttft_p95_rise"]["wfq"]
    assert check["met"] == (check["value"] < 0.05) == summary["targets"]["met"]
    assert printed["files"] == [str(tmp_path / "noisy-tenant.json"), str(tmp_path / "noisy-tenant.png")]
    assert "definitions" not in printed["summary"] and printed["summary"]["replicas"] == 4
    labels = {line.split("]")[0] for line in err.splitlines() if line.startswith("[sim")}
    assert labels == {f"[sim noisy-tenant: {run}" for run in ("wfq-baseline", "wfq-noisy", "fcfs-noisy")}
    assert err.rstrip().splitlines()[-1].startswith("wrote ")


def test_bad_arguments_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (["--rate-per-s", "0"], ["--replicas", "0"], ["--duration-s", "-1"]):
        assert cli.main(["--scenario", "steady", *bad, "--out", str(tmp_path)]) == 2
        assert "must be" in capsys.readouterr().err
    assert not tmp_path.joinpath("steady.json").exists()


def test_progress_lines_every_tenth_of_each_run_labelled() -> None:
    import io

    stream = io.StringIO()
    sink = ProgressLines(stream, "steady")
    for label in ("search 38 replicas", ""):
        for t in range(0, 41):
            sink(label, Tick(float(t), 40.0, num_arrived=t * 1_000, queue_depth=t, num_replicas=38))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 20
    assert (
        lines[0] == "[sim steady: search 38 replicas] 10% (t=4 s of 40): 4,000 requests, queue 4, replicas 38"
    )
    assert lines[10] == "[sim steady] 10% (t=4 s of 40): 4,000 requests, queue 4, replicas 38"
    assert lines[-1] == "[sim steady] 100% (t=40 s of 40): 40,000 requests, queue 40, replicas 38"
    with pytest.raises(ValueError, match="every_fraction"):
        ProgressLines(stream, "steady", every_fraction=0.0)


def test_a_target_not_measured_is_not_met() -> None:
    summary = {"ttft_p95_ms": None, "itl_p95_ms": 30.0, "shed_rate": 0.0}
    checks = judge("steady", summary)
    assert [c.met for c in checks] == [False, True, True]
    assert checks[0].measured == "not measured"
    with pytest.raises(ValueError, match="no targets"):
        judge("sideways", summary)
