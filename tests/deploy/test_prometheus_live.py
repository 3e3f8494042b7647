"""Prometheus against the dev stack (`make run`'s processes: gateway, control plane, tritonserver): it
scrapes all three with deploy/prometheus's rules, every rule evaluates without error, the cost per
million output tokens comes out of real traffic, and every dashboard query runs and the main panels
have data. Skipped, saying why, when Prometheus's Debian package cannot be fetched (Grafana is not in
Debian's registry: its JSON is checked statically by test_dashboards.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from ports import free_port
from prometheus_binary import prometheus_bin_dir

ROOT = Path(__file__).resolve().parents[2]
RULES = ("recording-rules.yml", "alert-rules.yml")
MODEL = "sluice-tiny"
READY_TIMEOUT_S = 120

pytestmark = pytest.mark.slow  # the dev stack starts tritonserver: about 25 s in all


def _get(url: str, timeout_s: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.loads(resp.read()) if "json" in resp.headers.get("Content-Type", "") else resp.read()


def _wait_for(what: str, ready: Any, timeout_s: float = READY_TIMEOUT_S) -> Any:
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            if found := ready():
                return found
        except OSError:
            pass
        assert time.monotonic() < deadline_s, f"{what} did not happen within {timeout_s} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(
    dev_checkpoint: Path, model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, int]]:
    """`python -m gateway.devstack` (what `make run` starts) on free ports, with a replica-hour price."""
    tmp = tmp_path_factory.mktemp("devstack")
    ports = {name: free_port() for name in ("gateway", "control_plane", "http", "grpc", "metrics")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        SLUICE_STATE_DIR=str(tmp / "state"),
        SLUICE_CHECKPOINT_DIR=str(dev_checkpoint),
        SLUICE_GATEWAY_PORT=str(ports["gateway"]),
        SLUICE_CONTROL_PLANE_PORT=str(ports["control_plane"]),
        SLUICE_TRITON_GRPC_URL=f"127.0.0.1:{ports['grpc']}",
        SLUICE_TRITON_METRICS_URL=f"http://127.0.0.1:{ports['metrics']}/metrics",
        SLUICE_DEV_TENANTS="true",
        SLUICE_REPLICA_HOUR_PRICE_USD="27",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.devstack", "--model-repository", str(model_repository),
         "--triton-http-port", str(ports["http"])],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_for("the dev stack's readiness", lambda: _get(f"http://127.0.0.1:{ports['gateway']}/readyz"))
        yield ports
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def prometheus(stack: dict[str, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus scraping the stack every second, evaluating the rules every second; its base URL."""
    found = prometheus_bin_dir()
    if isinstance(found, str):
        pytest.skip(found)
    tmp = tmp_path_factory.mktemp("prometheus")
    for name in RULES:  # NOTE: each group's own interval (30 s, 1 m) would make the test wait minutes
        rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / name).read_text())
        for group in rules["groups"]:
            group.pop("interval", None)
        (tmp / name).write_text(yaml.safe_dump(rules))
    jobs = {"sluice-gateway": "gateway", "sluice-control-plane": "control_plane", "sluice-replica": "metrics"}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / name) for name in RULES],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{stack[port]}"]}]}
            for job, port in jobs.items()
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [str(found / "prometheus"), f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_for("Prometheus's readiness", lambda: _get(f"{base_url}/-/ready"), timeout_s=30)
        yield base_url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _query(base_url: str, expr: str) -> list[dict[str, Any]]:
    body = _get(f"{base_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _dashboard_queries() -> Iterator[tuple[str, str, str]]:
    for path in sorted((ROOT / "deploy" / "grafana").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                yield path.name, panel["title"], target["expr"]


def test_prometheus_scrapes_the_stack_evaluates_every_rule_and_every_panel_query(
    stack: dict[str, int], prometheus: str
) -> None:
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{stack['gateway']}/v1", api_key="sk-acme-dev", max_retries=0
    )

    def scraped() -> bool:
        up = {s["metric"]["job"]: s["value"][1] for s in _query(prometheus, "up")}
        return up == {"sluice-gateway": "1", "sluice-control-plane": "1", "sluice-replica": "1"}

    _wait_for("all three jobs scraped", scraped, timeout_s=30)

    def cost_after_a_request() -> list[dict[str, Any]]:
        # NOTE: traffic while Prometheus watches: a rate needs the counter to move between two scrapes.
        client.completions.create(model=MODEL, prompt="def main():", max_tokens=8)
        return _query(prometheus, f'sluice:cost_per_million_output_tokens_usd{{model="{MODEL}"}}')

    cost = _wait_for("a cost per million output tokens", cost_after_a_request, timeout_s=30)
    assert float(cost[0]["value"][1]) > 0

    def every_rule_ran() -> list[dict[str, Any]] | None:
        groups = _get(f"{prometheus}/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return rules if all(rule.get("lastEvaluation", "").startswith("2") for rule in rules) else None

    rules = _wait_for("every rule evaluated", every_rule_ran, timeout_s=30)
    assert len(rules) >= 20
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []

    with_data = set()
    for dashboard, title, expr in _dashboard_queries():
        concrete = expr.replace("$__rate_interval", "30s").replace("$model", MODEL).replace("$version", "1")
        if _query(prometheus, concrete):
            with_data.add((dashboard, title))
    for wanted in [
        ("sluice-fleet.json", "Queue depth"),
        ("sluice-fleet.json", "Output tokens per second"),
        ("sluice-fleet.json", "KV cache occupancy by replica"),
        ("sluice-fleet.json", "Preemptions per second by replica"),
        ("sluice-fleet.json", "Replicas by state"),
        ("sluice-fleet.json", "Cost per million output tokens (last hour)"),
        ("sluice-model-version.json", "TTFT p50 / p95 / p99 by class"),
        ("sluice-model-version.json", "Running and waiting in each replica"),
        ("sluice-rollout.json", "Traffic share by version"),
    ]:
        assert wanted in with_data, f"{wanted} has no data"
