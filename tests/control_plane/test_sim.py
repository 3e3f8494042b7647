"""The fleet simulator (control_plane/sim): the calibration's anchors, one replica alone, and small,
scaled-down runs of every scenario through the real admission, quota, queue and dispatch policies."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from control_plane.sim import cli
from control_plane.sim.autoscaling import SimAutoscale
from control_plane.sim.calibration import seed_calibration
from control_plane.sim.progress import ProgressLines, Tick
from control_plane.sim.replica import Replica, ReplicaConfig
from control_plane.sim.scenarios import Options, run_scenario, tenants_for
from control_plane.sim.targets import judge
from control_plane.sim.workload import DEADLINE_AT_HEAD, SimRequest
from sluice.domain import Outcome, RequestClass
from sluice.policy.autoscale import AutoscaleConfig, Reason
from sluice.policy.batch_bound import BatchBound

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


def test_a_simulated_replica_keeps_the_gateways_batch_bound_from_its_own_gaps() -> None:
    """Without the step cap, decode steps beside 512-token prefill chunks run over the 40 ms target: the
    replica's running cap drops as the gateway's would (the same ``batch_bound`` rule, judged on the gaps
    its decoding sequences leave), and its load carries the cap to the dispatch gate."""
    cal = seed_calibration()
    config = ReplicaConfig(
        step_token_budget=512, step_time_cap_s=None, batch_bound=BatchBound(num_gaps_between_moves=32)
    )
    replica = Replica("r0", cal, config)
    for i in range(40):
        request = _request(1_000, 200)
        request.request_id = f"r{i}"
        replica.submit(request)
    held = []
    while replica.running_cap is None and replica.start_step() is not None:
        replica.end_step()
        held.append(replica.load().running_cap)
    # Held at the batch it ran while a step was over the target, until a window cut it.
    assert 40 in held
    assert replica.running_cap is not None and 1 <= replica.running_cap < 40
    assert replica.load().running_cap == replica.running_cap


def _summary(tmp_path: Path, scenario: str, options: Options = SMALL) -> dict:
    summary = run_scenario(scenario, options, tmp_path)
    assert (tmp_path / f"{scenario}.json").exists()
    assert (tmp_path / f"{scenario}.png").stat().st_size > 0
    assert json.loads((tmp_path / f"{scenario}.json").read_text()) == json.loads(json.dumps(summary))
    return summary


def test_a_simulated_replica_judges_its_cap_on_the_gaps_since_it_last_moved() -> None:
    """The gateway's rule (sluice.policy.batch_bound): one window with a slow step among sound ones does
    not cut the cap; a second in a row does."""
    config = ReplicaConfig(batch_bound=BatchBound(num_gaps_between_moves=100))
    replica = Replica("r0", seed_calibration(), config)
    replica.running_cap = 16
    replica._judge_cap(10.0, 100)  # a sound window
    for expected_cap in (16, 1):  # 8 of 200 slow, then 16 of 200 (nothing running: cut to 1)
        replica._judge_cap(80.0, 8)
        replica._judge_cap(10.0, 92)
        assert replica.running_cap == expected_cap


def test_steady_searches_replicas_from_the_roofline_bound(tmp_path: Path) -> None:
    summary = _summary(tmp_path, "steady", Options(duration_s=30.0, rate_per_s=20.0))
    found = summary["replica_search"]["found"]
    assert summary["lower_bound_replicas"] <= found == summary["replicas"]
    assert summary["meets_targets"]
    assert summary["ttft_p95_ms"] < 500 and summary["itl_p95_ms"] < 40
    assert summary["outcomes"] == {"finished": summary["num_arrived"]}
    assert 0 < summary["utilisation"] < 1


# doubling at small scale: the load doubles at 15 s of 45; the autoscaler decides every 10 s from 10 s on, a
# cold start takes 10 s, a promotion 5 s.
DOUBLING = replace(SMALL, duration_s=45.0, cold_start_s=10.0)


def test_doubling_runs_a_fixed_fleet_and_the_autoscaler_with_and_without_a_warm_pool(tmp_path: Path) -> None:
    summary = _summary(tmp_path, "doubling", DOUBLING)
    fixed, cold, warm = (summary[run] for run in ("fixed", "cold-only", "warm-pool"))
    assert summary["replicas"] == 4 and summary["warm_pool_replicas"] == 4  # default: the fleet's size
    assert fixed["shed_rate"] > 0  # twice the load on a fleet sized for once
    assert "autoscaler_decisions" not in fixed and "replicas_routed_max" not in fixed
    for run in (fixed, cold, warm):
        assert run["interactive_served_past_deadline"] == 0 and run["every_refusal_has_retry_after"]
    first_up = warm["autoscaler_actions"][0]["reason"]
    assert "4 from the warm pool, 0 cold" in first_up and "warm pool 0 of 4: starting 4" in first_up
    assert "0 from the warm pool" in cold["autoscaler_actions"][0]["reason"]
    assert warm["replicas_routed_max"] > 4 and cold["replicas_routed_max"] > 4
    assert warm["replicas_paid_mean"] > cold["replicas_paid_mean"]  # the warm pool holds GPUs: it costs
    assert warm["shed_rate"] < fixed["shed_rate"]
    checks = {c["target"]: c for c in summary["targets"]["checks"]}
    after = checks["TTFT p95 from 25 s after the doubling < 500 ms"]
    assert after["value"] == warm["ttft_p95_ms_after_doubling"] is not None
    assert after["met"] == (after["value"] < 500)


def test_the_autoscaled_fleet_drains_one_replica_at_a_time_and_kills_no_request() -> None:
    from control_plane.sim.scenarios import interactive_stream, run_fleet

    tenants = tenants_for(SMALL)
    policy = AutoscaleConfig(min_replicas=2, max_replicas=8, warm_pool_replicas=1, scale_down_cooldown_s=4.0)
    autoscale = SimAutoscale(policy, interval_s=2.0, cold_start_s=10.0, promote_s=1.0)
    quiet = Options(replicas=8, duration_s=60.0, rate_per_s=2.0)  # 8 replicas for a trickle: calm
    run = run_fleet(quiet, 8, tenants, [interactive_stream(quiet, tenants)], autoscale=autoscale)
    assert run.scaler is not None
    routed = [s.num_routed for s in run.scaler.samples]
    assert routed[-1] == 2 < routed[0] == 8  # down to the minimum...
    assert all(b - a in (0, -1) for a, b in itertools.pairwise(routed))  # ...one at a time
    assert all(s.num_draining <= 1 for s in run.scaler.samples)
    downs = [d for _, d in run.scaler.decisions if d.num_drain or d.num_demote]
    assert len(downs) == 6 and all(d.reason_code is Reason.CALM for d in downs)
    assert {r.outcome for r in run.requests} == {Outcome.FINISHED}  # a drain kills nothing
    assert run.scaler.samples[-1].num_warm == 1


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
    counts: dict[Outcome | None, int] = {o: 0 for o in (*Outcome, None)}
    for r in run.requests:
        counts[r.outcome] += 1
        if r.outcome is Outcome.REFUSED:
            assert r.dispatch_s is None  # never reached a replica
            if r.reason == DEADLINE_AT_HEAD:  # dropped at the head of the queue
                assert r.retry_after_s is None and r.first_token_s is None
            else:
                assert r.reason and r.retry_after_s is not None and r.retry_after_s > 0
        if r.outcome is Outcome.FINISHED:
            assert r.first_token_s is not None and r.finish_s is not None
    assert counts[None] == 0  # the drain let everything in flight finish
    assert counts[Outcome.REFUSED] > 0 and counts[Outcome.FINISHED] > 0
    assert sum(counts.values()) == len(run.requests)
    emitted = sum(run.step_num_emitted)
    assert math.isclose(emitted, sum(r.max_tokens for r in run.requests if r.outcome is Outcome.FINISHED))


def test_same_seed_same_summary(tmp_path: Path) -> None:
    short = replace(DOUBLING, duration_s=20.0)  # the autoscaler decides at 10 s: its path is covered
    first = run_scenario("doubling", short, tmp_path / "a")
    again = run_scenario("doubling", short, tmp_path / "b")
    other = run_scenario("doubling", replace(short, seed=1), tmp_path / "c")
    assert (tmp_path / "a" / "doubling.json").read_text() == (tmp_path / "b" / "doubling.json").read_text()
    assert first == again
    assert other["fixed"]["num_arrived"] != first["fixed"]["num_arrived"]


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
    out, err = _sim(tmp_path, capsys, "--scenario", "steady")
    assert out.splitlines()[0].split() == " ".join(TABLE_HEADERS).split()
    [row] = _table(out)
    summary = json.loads((tmp_path / "steady.json").read_text())
    verdict = "met" if summary["targets"]["met"] else "not met"
    assert row["scenario"] == "steady" and row["replicas"] == "4" and row["targets"] == verdict
    assert row["TTFT p95 ms"] == f"{summary['ttft_p95_ms']:,.0f}"  # over 100 ms: whole ms
    assert row["ITL p50 ms"] == f"{summary['itl_p50_ms']:.1f}"
    assert row["shed"] == f"{summary['shed_rate']:.2%}"
    assert row["$/M out tokens"] == f"${summary['cost_per_m_output_tokens_usd']:,.2f}"
    assert "TTFT p95 < 500 ms" in out and "ITL p95 < 40 ms" in out
    assert out.rstrip().splitlines()[-1].startswith(f"wrote {tmp_path / 'steady.json'} and ")
    progress = err.splitlines()  # stderr has the progress lines only
    assert [line.split("]")[0] for line in progress] == ["[sim steady"] * 10
    percents = [int(line.split("] ")[1].split("%")[0]) for line in progress]
    # one line at the first sample (every simulated second) at or past each tenth: 1.5 s -> t=2 s, 13 %
    assert [p // 10 for p in percents] == list(range(1, 11)) and percents[0] == 13
    assert progress[-1].startswith("[sim steady] 100% (t=15 s of 15): ")
    assert " requests, queue " in progress[-1] and progress[-1].endswith(", replicas 4")


def test_doubling_shows_a_row_per_run_judges_the_warm_pool_and_the_autoscaled_replicas(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--scenario", "doubling", "--replicas", "4", "--duration-s", "45", "--rate-per-s", "20"]
    assert cli.main([*args, "--cold-start-s", "10", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    summary = json.loads((tmp_path / "doubling.json").read_text())
    rows = _table(out)
    assert [r["scenario"] for r in rows] == ["doubling fixed", "doubling cold-only", "doubling warm-pool"]
    assert rows[0]["replicas"] == "4" and rows[0]["targets"] == "-" and rows[1]["targets"] == "-"
    most = summary["warm-pool"]["replicas_routed_max"]
    assert rows[2]["replicas"] == f"4→{most}" and most > 4
    assert rows[2]["targets"] == ("met" if summary["targets"]["met"] else "not met")
    assert "targets (warm-pool)" in out and "TTFT p95 from 25 s after the doubling < 500 ms" in out
    labels = {line.split("]")[0] for line in err.splitlines()}
    assert labels == {f"[sim doubling: {run}" for run in ("fixed", "cold-only", "warm-pool")}


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
    bad_args = (["--rate-per-s", "0"], ["--replicas", "0"], ["--duration-s", "-1"], ["--cold-start-s", "-1"])
    for bad in (*bad_args, ["--warm-pool", "-1"]):
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
