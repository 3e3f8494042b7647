"""`make run`'s process: tritonserver + gateway come up together, serve the openai client, and one
Ctrl-C (SIGINT) stops both, leaving no process behind. Its log says what runs, warns that the dev keys
are on, and stays quiet while it serves (not a line per replica metrics read)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai
from ports import free_port
from proc_table import processes_mentioning

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_devstack_serves_and_one_sigint_stops_everything(
    dev_checkpoint: Path, model_repository: Path, tmp_path: Path, three_free_ports: list[int]
) -> None:
    http, grpc, metrics = three_free_ports
    gateway = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        SLUICE_STATE_DIR=str(tmp_path / "state"),
        SLUICE_CHECKPOINT_DIR=str(dev_checkpoint),
        SLUICE_GATEWAY_PORT=str(gateway),
        SLUICE_TRITON_GRPC_URL=f"127.0.0.1:{grpc}",
        SLUICE_TRITON_METRICS_URL=f"http://127.0.0.1:{metrics}/metrics",
        SLUICE_REPLICA_POLL_INTERVAL_MS="50",  # 20 reads a second: any per-read log line would show
        SLUICE_DEV_TENANTS="true",  # as `make run` sets it
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.devstack", "--model-repository", str(model_repository),
         "--triton-http-port", str(http)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    marker = str(tmp_path / "state")  # in the tritonserver's and the stub's command lines
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{gateway}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        else:
            raise AssertionError("the dev stack did not become ready")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway}/v1", api_key="sk-acme-dev")
        reply = client.chat.completions.create(
            model="sluice-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3
        )
        assert reply.usage is not None and reply.usage.completion_tokens >= 1
        assert processes_mentioning(marker), "tritonserver should be running"
        time.sleep(0.5)  # serving, idle: the replica is read ~10 times meanwhile
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while processes_mentioning(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_mentioning(marker) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        banner = proc.stderr.read()
    assert "sk-acme-dev" in banner and "sk-globex-dev" in banner and "curl" in banner
    log_lines = [line for line in banner.splitlines() if " INFO " in line or " WARNING " in line]
    assert any("gateway up: routing static: model sluice-tiny" in line and "dev tenants ON" in line for line in log_lines)
    assert any("WARNING" in line and "must not be used in production" in line for line in log_lines)
    assert not [line for line in log_lines if "/metrics" in line or "HTTP Request" in line]


def test_make_run_turns_the_dev_tenants_on_unless_told_otherwise() -> None:
    dry_run = subprocess.run(["make", "-n", "run"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert "SLUICE_DEV_TENANTS=${SLUICE_DEV_TENANTS:-true} exec" in dry_run.stdout
