"""The OpenAPI schema, fuzzed: schemathesis generates valid and invalid requests (bodies, query strings,
headers) for every operation in ``/schema/openapi.json`` and fails on any 5xx.

Bounded in time (``SCHEMATHESIS_MAX_S``, default 100 s) and reproducible (``--seed``,
``SCHEMATHESIS_SEED``, default 0). A failure prints schemathesis's report, which has a curl
line to reproduce each server error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import ACME_KEY, MODEL, RunningGateway, start_gateway

MAX_S = int(os.environ.get("SCHEMATHESIS_MAX_S", "100"))
SEED = int(os.environ.get("SCHEMATHESIS_SEED", "0"))


@pytest.fixture(scope="module")
def fuzzed_gateway(
    dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    # Short outputs keep each generated request that reaches the engine cheap, so the time goes to
    # exploring inputs.
    gateway = start_gateway(
        tmp_path_factory.mktemp("gateway_schemathesis"),
        dev_checkpoint,
        engine_client="inprocess",
        max_prompt_tokens=256,
        max_output_tokens=16,
        max_body_bytes=64 * 1024,
    )
    yield gateway
    gateway.stop()


@pytest.mark.slow
def test_no_server_error_under_schemathesis(fuzzed_gateway: RunningGateway, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
        "SCHEMATHESIS_SERVED_MODEL": MODEL,
    }
    cmd = [
        sys.executable, "-m", "schemathesis.cli", "run", f"{fuzzed_gateway.base_url}/schema/openapi.json",
        "--header", f"Authorization: Bearer {ACME_KEY}",
        "--checks", "not_a_server_error",
        "--mode", "all",  # valid and invalid data
        "--phases", "examples,coverage,fuzzing,stateful",
        "--max-time", str(MAX_S),
        "--seed", str(SEED),
        "--workers", "2",
        "--request-timeout", "30",
        "--no-color",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]  # fmt: skip
    run = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=MAX_S + 120)
    report = run.stdout[-12_000:] + run.stderr[-4_000:]
    print(run.stdout[-1_500:])  # the summary: operations, phases, cases generated (shown with -s / -rA)
    assert run.returncode == 0, f"schemathesis found server errors:\n{report}"
    # The run must have reached the engine, not only bounced off validation: generated requests that
    # name the served model and pass admission finish with tokens.
    finished = [t for t in fuzzed_gateway.telemetry() if t["outcome"] == "finished"]
    assert len(finished) >= 10, f"only {len(finished)} generated requests reached the engine:\n{report}"
