"""The control plane as a real process for the build tests (``python -m control_plane.service`` on a free
port, its registry in its own SQLite file, the dev admin token on)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from ports import free_port

from sluice.admin_tokens.dev import DEV_ADMIN_TOKEN

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ControlPlane:
    url: str
    token: str = DEV_ADMIN_TOKEN


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """``python -m control_plane.service`` on a free port with the dev admin token (platform-admin)."""
    state_dir = tmp_path_factory.mktemp("cp") / "state"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SLUICE_")}
    env.update(
        SLUICE_STATE_DIR=str(state_dir), SLUICE_CONTROL_PLANE_PORT=str(port), SLUICE_DEV_TENANTS="true"
    )
    log_path = state_dir.parent / "service.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.service"],
            cwd=REPO,
            env=env,
            stdout=log_file,
            stderr=log_file,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        yield ControlPlane(url)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    assert "Traceback" not in log_path.read_text()
