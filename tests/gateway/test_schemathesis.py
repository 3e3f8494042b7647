"""The OpenAPI schema, fuzzed: schemathesis generates valid and invalid requests (bodies, query strings,
headers) for every operation in ``/schema/openapi.json`` and fails on any 5xx.

Bounded in time (``SCHEMATHESIS_MAX_S``, default 100 s, split between two runs) and reproducible
(``--seed``, ``SCHEMATHESIS_SEED``, default 0). A failure prints schemathesis's report, which has a curl
line to reproduce each server error.

Two runs over one gateway: the completion endpoints alone for 60% of the time (the requests that reach
the engine, so generation, streaming and billing get fuzzed, not only validation: a single run over every
operation, files and batches included, left them too little time to reach it), then every other
operation.
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


COMPLETIONS = "^/v1/(chat/)?completions$"
# (name, operations chosen by their path, share of MAX_S, generated requests that must finish on the engine)
SLICES = [
    ("completions", ["--include-path-regex", COMPLETIONS], 0.6, 10),
    ("the-rest", ["--exclude-path-regex", COMPLETIONS], 0.4, 0),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "selection", "share", "min_finished"), SLICES, ids=[s[0] for s in SLICES])
def test_no_server_error_under_schemathesis(
    fuzzed_gateway: RunningGateway,
    tmp_path: Path,
    name: str,
    selection: list[str],
    share: float,
    min_finished: int,
) -> None:
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
        *selection,
        "--max-time", str(max(10, int(MAX_S * share))),
        "--seed", str(SEED),
        # NOTE: one worker. Two threads parsing source at once (hypothesis describes filters by their
        # lambdas' AST) trip CPython 3.11's "AST constructor recursion depth mismatch" now and then
        # (python/cpython gh-106905): a runtime error in the fuzzer, not a server error; it failed CI once.
        "--workers", "1",
        "--request-timeout", "30",
        "--no-color",
        "--report", "junit", "--report-dir", str(tmp_path),
    ]  # fmt: skip
    finished_before = _num_finished(fuzzed_gateway)
    run = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=MAX_S + 120)
    report = run.stdout[-12_000:] + run.stderr[-4_000:]
    print(run.stdout[-1_500:])  # the summary: operations, phases, cases generated (shown with -s / -rA)
    assert run.returncode == 0, f"schemathesis found server errors:\n{report}"
    # The run must have reached the engine, not only bounced off validation: generated requests that
    # name the served model and pass admission finish with tokens.
    finished = _num_finished(fuzzed_gateway) - finished_before
    print(f"{name}: {finished} generated requests finished on the engine")
    assert finished >= min_finished, f"only {finished} generated requests reached the engine:\n{report}"


def _num_finished(gateway: RunningGateway) -> int:
    return sum(1 for t in gateway.telemetry() if t["outcome"] == "finished")
