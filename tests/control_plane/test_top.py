"""``sluice top``'s pure parts over canned metrics: the histogram quantile and counter arithmetic
(``control_plane.metrics_text``, shared with the autoscaler's signals), and the rows, table and JSON built
from two scrapes and a replica list (``top_view``).
The gateway's text comes from the gateway's own exporter (``GatewayMetrics``); a replica's is written as
Triton prints the CPU engine's families. The command against sources that cannot be reached (once, and
live until Ctrl-C), and its usage errors, at the end."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from control_plane.cli.main import main
from control_plane.cli.top import CLEAR_SCREEN
from control_plane.cli.top_render import HEADERS, as_json, render
from control_plane.cli.top_view import Scrape, Sources, Window, build_snapshot
from control_plane.metrics_text import (
    Metrics,
    bucket_counts,
    bucket_increase,
    histogram_quantile,
    increase,
)
from gateway.metrics import GatewayMetrics

REPO = Path(__file__).resolve().parents[2]
MODEL = "sluice-tiny"
INF = math.inf


# ---------------------------------------------------------------------------------- arithmetic


def test_the_quantile_interpolates_inside_its_bucket() -> None:
    cumulative = {0.1: 50.0, 0.2: 90.0, 0.4: 100.0, INF: 100.0}
    assert histogram_quantile(0.95, cumulative) == pytest.approx(0.3)  # 5 of the bucket's 10, halfway
    assert histogram_quantile(0.5, cumulative) == pytest.approx(0.1)
    assert histogram_quantile(0.25, cumulative) == pytest.approx(0.05)  # the first bucket starts at 0


def test_the_quantile_beyond_the_last_bound_and_of_nothing() -> None:
    assert histogram_quantile(0.95, {0.1: 1.0, 1.0: 2.0, INF: 10.0}) == 1.0  # the largest finite bound
    assert histogram_quantile(0.95, {0.1: 0.0, INF: 0.0}) is None
    assert histogram_quantile(0.95, {}) is None
    with pytest.raises(ValueError, match="q must be"):
        histogram_quantile(1.5, {INF: 1.0})


def test_increases_survive_a_restart() -> None:
    assert increase(10.0, 25.0) == 15.0
    assert increase(None, 7.0) == 7.0  # the series started between the scrapes
    assert increase(30.0, 4.0) == 4.0  # the process restarted: it counts from zero since
    assert increase(3.0, None) is None
    assert bucket_increase({1.0: 5.0, INF: 6.0}, {1.0: 7.0, INF: 9.0}) == {1.0: 2.0, INF: 3.0}
    assert bucket_increase({1.0: 5.0, INF: 6.0}, {1.0: 1.0, INF: 2.0}) == {1.0: 1.0, INF: 2.0}


def test_parsing_and_lenient_label_matching() -> None:
    metrics = Metrics.parse(
        'a_metric{model="m",kind="x"} 2\na_metric{model="other",kind="x"} 5\na_metric{kind="x"} 1\n'
    )
    assert metrics.total("a_metric", model="m", kind="x") == 3.0  # a sample without a model label counts
    assert metrics.total("a_metric", model="nope", kind="y") is None
    assert metrics.label_values("a_metric", "model") == {("m",), ("other",)}
    with pytest.raises(ValueError, match="not Prometheus text"):
        Metrics.parse("this is { not metrics")


# ---------------------------------------------------------------------------------- canned sources


def _gateway_text(
    num_slow: int, num_fast: int, num_queued: int, num_output_tokens: int, num_refused: int = 0,
    num_batch_lines: int = 0, num_batches: int = 0,
) -> str:  # fmt: skip
    """The gateway's exporter after ``num_slow`` requests with a 5 s TTFT and ``num_fast`` with 30 ms
    (interactive and batch), each with inter-token gaps of 10 ms; refusals and batch lines split over two
    label values each, ``num_batches`` batches held."""
    metrics = GatewayMetrics()
    metrics.refused.labels(MODEL, "service_overloaded").inc(num_refused // 2)
    metrics.refused.labels(MODEL, "tokens_per_minute_exceeded").inc(num_refused - num_refused // 2)
    metrics.batch_lines.labels("completed").inc(num_batch_lines - 1 if num_batch_lines else 0)
    metrics.batch_lines.labels("failed").inc(1 if num_batch_lines else 0)
    metrics.batches_active.set(num_batches)
    for i in range(num_slow + num_fast):
        request_class = "interactive" if i % 2 else "batch"
        metrics.ttft_s.labels(MODEL, "1", request_class).observe(5.0 if i < num_slow else 0.03)
        for _ in range(4):
            metrics.inter_token_s.labels(MODEL, "1", request_class).observe(0.01)
    metrics.queue_depth.labels(MODEL, "1", "general", "interactive").set(num_queued)
    metrics.queue_depth.labels(MODEL, "1", "general", "batch").set(1)
    # Split over two series (labelled by model, version and class): the rate sums them.
    metrics.output_tokens.labels(MODEL, "1", "interactive").inc(num_output_tokens // 4)
    metrics.output_tokens.labels(MODEL, "1", "batch").inc(num_output_tokens - num_output_tokens // 4)
    return metrics.render().decode()


def _replica_text(active: int, waiting: int, used_blocks: int, generated_tokens: int) -> str:
    lines = [
        "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
        "# TYPE nv_trt_llm_request_metrics gauge",
        f'nv_trt_llm_request_metrics{{model="{MODEL}",request_type="active",version="1"}} {active}',
        f'nv_trt_llm_request_metrics{{model="{MODEL}",request_type="waiting",version="1"}} {waiting}',
        "# TYPE nv_trt_llm_kv_cache_block_metrics gauge",
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",model="{MODEL}",version="1"}} '
        f"{used_blocks}",
        f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="{MODEL}",version="1"}} 256',
        "# TYPE sluice_engine_generated_tokens_total counter",
        f'sluice_engine_generated_tokens_total{{model="{MODEL}",version="1"}} {generated_tokens}',
    ]
    return "\n".join(lines) + "\n"


def _scrape(url: str, at_s: float, text: str) -> Scrape:
    return Scrape(url, at_s, Metrics.parse(text))


def _replica(replica_id: str, state: str, metrics_url: str, detail: str = "") -> dict[str, object]:
    return {
        "replica_id": replica_id, "model": MODEL, "version": "1", "state": state,
        "metrics_url": metrics_url, "health_detail": detail,
    }  # fmt: skip


GATEWAY_URL = "http://gw/metrics"
DOWN_GATEWAY_URL = "http://gw-down/metrics"


def _sources() -> Sources:
    """r1 ready and read twice 2 s apart; r2 unhealthy, its metrics unreachable; r3 without a metrics
    URL; one gateway read twice 2 s apart, another unreachable."""
    r1_before = _replica_text(active=3, waiting=0, used_blocks=10, generated_tokens=1000)
    r1_after = _replica_text(active=5, waiting=2, used_blocks=64, generated_tokens=1500)
    r1 = Window(_scrape("http://r1/metrics", 10.0, r1_before), _scrape("http://r1/metrics", 12.0, r1_after))
    r2 = Window(None, Scrape("http://r2/metrics", 12.0, None, "unreachable (ConnectError: refused)"))
    gateway_before = _gateway_text(num_slow=100, num_fast=0, num_queued=0, num_output_tokens=400,
                                   num_refused=10, num_batch_lines=20, num_batches=1)  # fmt: skip
    gateway_after = _gateway_text(num_slow=100, num_fast=40, num_queued=3, num_output_tokens=1000,
                                  num_refused=30, num_batch_lines=50, num_batches=2)  # fmt: skip
    gateway = Window(_scrape(GATEWAY_URL, 10.5, gateway_before), _scrape(GATEWAY_URL, 12.5, gateway_after))
    down = Window(None, Scrape(DOWN_GATEWAY_URL, 12.5, None, "unreachable (ConnectError: refused)"))
    return Sources(
        admin_url="http://cp",
        replicas=[
            _replica("r2", "unhealthy", "http://r2/metrics", "probe timed out"),
            _replica("r1", "ready", "http://r1/metrics"),
            _replica("r3", "ready", ""),
        ],
        admin_error=None,
        replica_windows={"http://r1/metrics": r1, "http://r2/metrics": r2},
        gateway_windows=[gateway, down],
    )


# ---------------------------------------------------------------------------------- rows


def test_rows_per_version_and_replica() -> None:
    snapshot = build_snapshot(_sources())
    version, r1, r2, r3 = snapshot.rows
    assert [(r.version, r.replica) for r in snapshot.rows] == [
        ("1", ""),
        ("1", "r1"),
        ("1", "r2"),
        ("1", "r3"),
    ]

    assert (r1.state, r1.num_running, r1.num_waiting, r1.kv_used_pct) == ("ready", 3, 2, 25.0)
    assert r1.tokens_per_s == pytest.approx(250.0)  # 500 tokens in 2 s
    assert r1.ttft_p95_ms is None  # the CPU engine exports no TTFT histogram
    assert (r2.state, r2.num_running, r2.tokens_per_s) == ("unhealthy", None, None)
    assert r2.health == "probe timed out; metrics: unreachable (ConnectError: refused)"
    assert r3.health == "no metrics URL"

    assert version.state == "2/3 ready"
    assert (version.num_running, version.num_waiting, version.kv_used_pct) == (3, 2, 25.0)
    assert version.num_queued == 4  # 3 interactive + 1 batch at the gateway that answered
    assert version.tokens_per_s == pytest.approx(250.0)
    # Only this window's 40 requests (30 ms, in the 20-40 ms bucket), not the 100 slow ones before it.
    assert version.ttft_p95_ms is not None and 20.0 < version.ttft_p95_ms <= 40.0
    assert version.itl_p95_ms is not None and 5.0 < version.itl_p95_ms <= 10.0
    assert snapshot.gateway_output_tokens_per_s == pytest.approx(300.0)  # 600 tokens in 2 s
    assert snapshot.gateway_refused_per_s == pytest.approx(10.0)  # 20 refusals in 2 s, both reasons
    assert snapshot.gateway_batch_lines_per_s == pytest.approx(15.0)  # 30 lines in 2 s
    assert snapshot.gateway_batches_active == 2  # as the latest read says
    assert snapshot.window_s == pytest.approx(2.0)
    assert [(s.kind, s.error is None) for s in snapshot.sources] == [
        ("admin", True), ("gateway", True), ("gateway", False), ("replica", True), ("replica", False),
    ]  # fmt: skip


def test_a_first_read_has_loads_but_no_rates() -> None:
    sources = _sources()
    first = Sources(
        sources.admin_url,
        sources.replicas,
        None,
        {url: Window(None, w.after) for url, w in sources.replica_windows.items()},
        [Window(None, w.after) for w in sources.gateway_windows],
    )
    snapshot = build_snapshot(first)
    version, r1, *_ = snapshot.rows
    assert (r1.num_running, r1.tokens_per_s, version.ttft_p95_ms, version.num_queued) == (3, None, None, 4)
    assert snapshot.window_s is None and "second read" in snapshot.notes[0]


def test_an_unreachable_admin_api_still_shows_the_gateways_versions() -> None:
    sources = _sources()
    blind = Sources(
        "http://cp", None, "the admin API at http://cp is unreachable", {}, sources.gateway_windows
    )
    snapshot = build_snapshot(blind)
    (version,) = snapshot.rows
    assert (version.model, version.version, version.state) == (MODEL, "1", "no replicas")
    assert version.ttft_p95_ms is not None
    # No replica reports tokens: the gateways' count of the window's 40 ended requests, 5 tokens each
    # (a first token and 4 gaps), over 2 s.
    assert version.tokens_per_s == pytest.approx(100.0)
    assert "admin http://cp: the admin API at http://cp is unreachable" in render(snapshot, "title")
    assert build_snapshot(blind, model="another-model").rows == []


def test_the_table_and_the_json() -> None:
    snapshot = build_snapshot(_sources())
    text = render(snapshot, "sluice top: every 2 s")
    lines = text.splitlines()
    assert lines[0] == "sluice top: every 2 s"
    header = lines[2]
    assert all(h in header for h in HEADERS)
    version_line, r1_line = lines[3], lines[4]
    assert version_line.split()[:6] == [MODEL, "1", "(all)", "2/3", "ready", "3"]
    assert r1_line.split()[:7] == ["r1", "ready", "3", "2", "-", "25.0", "-"]
    assert (
        "gateways: 1/2 read, 300.0 output tokens/s, 10.0 refused/s; batches: 2 running, 15.0 lines/s" in text
    )
    assert f"gateway {DOWN_GATEWAY_URL}: unreachable (ConnectError: refused)" in text
    assert "replica http://r2/metrics: unreachable" in text

    body = json.loads(json.dumps(as_json(snapshot, "2026-12-01T00:00:00+00:00")))
    assert body["gateway_output_tokens_per_s"] == 300.0 and body["window_s"] == 2.0
    row = body["rows"][1]
    assert row["replica"] == "r1" and row["tokens_per_s"] == 250.0 and row["kv_used_pct"] == 25.0
    assert row["ttft_p95_ms"] is None


def test_bucket_counts_sum_the_classes_of_one_version() -> None:
    metrics = Metrics.parse(_gateway_text(num_slow=0, num_fast=6, num_queued=0, num_output_tokens=0))
    counts = bucket_counts(metrics, "sluice_gateway_time_to_first_token_seconds", model=MODEL, version="1")
    assert counts[INF] == 6.0 and counts[0.02] == 0.0 and counts[0.04] == 6.0
    assert (
        bucket_counts(metrics, "sluice_gateway_time_to_first_token_seconds", model=MODEL, version="2") == {}
    )


# ---------------------------------------------------------------------------------- the command


def test_the_command_names_what_it_could_not_read(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["top", "--once", "--interval", "0.1", "--admin-url", "http://127.0.0.1:1"]
    assert main([*argv, "--gateway", "http://127.0.0.1:1/metrics"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "Traceback" not in out
    assert "admin http://127.0.0.1:1: the admin API at http://127.0.0.1:1 is unreachable" in out
    assert "gateway http://127.0.0.1:1/metrics: unreachable" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--interval", "0"], "seconds in [0.1, 3600] expected"),
        (["--interval", "soon"], "seconds in [0.1, 3600] expected"),
        (["--gateway", "127.0.0.1:8080"], "an http(s):// URL expected"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_live_view_redraws_until_ctrl_c(tmp_path: Path) -> None:
    """As a process: each refresh clears the screen and redraws, the unreachable sources named each time;
    Ctrl-C (SIGINT) ends it with exit 0 and no traceback."""
    out_path = tmp_path / "top.out"
    argv = ["top", "--interval", "0.2", "--admin-url", "http://127.0.0.1:1"]
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "control_plane.cli.main",
                *argv,
                "--gateway",
                "http://127.0.0.1:1/metrics",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while out_path.read_text().count(CLEAR_SCREEN) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, out_path.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
    text = out_path.read_text()
    frames = text.split(CLEAR_SCREEN)[1:]
    assert all("gateway http://127.0.0.1:1/metrics: unreachable" in frame for frame in frames[:3])
    assert "Traceback" not in text


def _triton_first_response_text(num_fast: int, num_slow: int) -> str:
    """Triton's first-response histogram (milliseconds), as it exports it with histogram_latencies."""
    labels = f'model="{MODEL}",version="1"'
    cumulative = {"100": num_fast, "500": num_fast, "2000": num_fast + num_slow, "+Inf": num_fast + num_slow}
    lines = ["# TYPE nv_inference_first_response_histogram_ms histogram"]
    lines += [
        f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="{le}"}} {n}'
        for le, n in cumulative.items()
    ]
    lines += [
        f"nv_inference_first_response_histogram_ms_count{{{labels}}} {num_fast + num_slow}",
        f"nv_inference_first_response_histogram_ms_sum{{{labels}}} 0",
    ]
    return "\n".join(lines) + "\n"


def test_a_replica_exporting_first_response_latency_gets_a_ttft_p95() -> None:
    url = "http://r1/metrics"
    before = _replica_text(3, 0, 10, 1000) + _triton_first_response_text(num_fast=0, num_slow=50)
    after = _replica_text(3, 0, 10, 1000) + _triton_first_response_text(num_fast=20, num_slow=50)
    window = Window(_scrape(url, 1.0, before), _scrape(url, 3.0, after))
    sources = Sources("http://cp", [_replica("r1", "ready", url)], None, {url: window}, [])
    _, r1 = build_snapshot(sources).rows
    assert r1.ttft_p95_ms == pytest.approx(95.0)  # this window's 20, all under 100 ms; not the 50 slow
    assert r1.tokens_per_s == 0.0
