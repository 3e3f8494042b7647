"""With ``CI=true`` a PostgreSQL or Redis the tests cannot reach fails the run; without it the tests that
need the server skip, saying why. Checked by running real tests of each kind in a child pytest pointed at
servers that are not there (port 1 refuses)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NEEDS_A_SERVER = [
    # Redis through the redis_up fixture; PostgreSQL through the contract suites' session database and
    # through a test's own created_database().
    "tests/core/test_quota.py::test_grants_come_from_redis_again_once_it_is_back",
    "tests/core/test_ledger.py::test_record_then_query_round_trips[postgres]",
    "tests/control_plane/test_cli_tenants.py::test_the_same_commands_against_postgresql",
]


def _run(ci: str | None) -> tuple[int, dict[str, int]]:
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("SLUICE_")}
    env.update(
        TEST_REDIS_URL="redis://127.0.0.1:1/0",
        TEST_POSTGRES_ADMIN_URL="postgresql://postgres@127.0.0.1:1/postgres",
    )
    if ci is not None:
        env["CI"] = ci
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *NEEDS_A_SERVER],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = proc.stdout.strip().splitlines()[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    return proc.returncode, counts


def test_with_ci_set_a_missing_server_fails_the_run() -> None:
    returncode, counts = _run("true")
    assert returncode == 1, counts
    assert "skipped" not in counts and "passed" not in counts
    assert counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0) == len(NEEDS_A_SERVER)


def test_without_ci_a_missing_server_skips_the_tests_that_need_it() -> None:
    returncode, counts = _run(None)
    assert returncode == 0 and counts == {"skipped": len(NEEDS_A_SERVER)}
