"""Fixtures for the engine-build pipeline's tests: moto's S3 server on 127.0.0.1 (tests/s3_server.py),
the dev checkpoint uploaded there as a source, the control plane as a real process (its registry in
its own SQLite file) and a clean environment pointing the in-process CLI at both."""

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
from s3_server import MotoS3, moto_s3, s3_bucket  # noqa: F401  (fixtures, found by name)

from sluice.admin_tokens.dev import DEV_ADMIN_TOKEN
from sluice.settings import get_settings
from sluice.weight_store import WeightStore

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


@pytest.fixture
def build_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, moto_s3: MotoS3) -> Iterator[Path]:  # noqa: F811
    """No SLUICE_* variable of the caller's shell; state (and the weight cache) under tmp_path; the
    weight store on the moto server. Returns the state folder."""
    for name in list(os.environ):
        if name.upper().startswith("SLUICE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SLUICE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SLUICE_DEV_TENANTS", "false")
    monkeypatch.setenv("SLUICE_S3_ENDPOINT_URL", moto_s3.endpoint_url)
    get_settings.cache_clear()
    yield tmp_path / "state"
    get_settings.cache_clear()


@pytest.fixture
def source_uri(build_env: Path, s3_bucket: str, dev_checkpoint: Path) -> str:  # noqa: F811
    """The dev checkpoint (cpu_engine.devckpt, as in .sluice/models/sluice-tiny) uploaded to a fresh
    bucket as a build's source."""
    uri = f"s3://{s3_bucket}/checkpoints/sluice-tiny"
    WeightStore.from_settings(get_settings(), quiet=True).upload_dir(
        dev_checkpoint, uri, {"kind": "checkpoint"}
    )
    return uri
