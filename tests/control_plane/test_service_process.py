"""``python -m control_plane.service`` as an operator starts it: a real process on the port settings
give, its log as a person reads it, SIGTERM ending it cleanly; and a bad setting refused at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from control_plane_process import REPO, running_control_plane, service_env

from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN


def test_the_service_serves_on_its_port_logs_readably_and_stops_on_sigterm(tmp_path: Path) -> None:
    # Its start, readiness wait, SIGTERM and clean exit (0, or by the signal uvicorn re-raises once shut
    # down) are checked by running_control_plane, as for every test that starts the service.
    with running_control_plane(tmp_path / "state") as service:
        base_url = service.url
        assert httpx.get(f"{base_url}/healthz").status_code == 200
        headers = {"Authorization": f"Bearer {DEV_ADMIN_TOKEN}"}
        assert httpx.get(f"{base_url}/admin/v1/whoami", headers=headers).json()["role"] == "platform-admin"
        assert httpx.get(f"{base_url}/admin/v1/whoami").status_code == 401
        assert httpx.get(f"{base_url}/readyz").status_code == 200
    log = service.log_path.read_text()
    assert "Application shutdown complete" in log
    assert f"control plane up on {base_url}" in log
    assert "dev admin token 'dev-admin' (platform-admin) is active" in log
    assert "GET /admin/v1/whoami -> 200" in log and "by dev-admin (platform-admin)" in log
    assert "GET /admin/v1/whoami -> 401" in log and "by an unauthenticated caller" in log
    assert "/healthz" not in log and "/readyz" not in log  # probes are counted, not logged
    assert "control plane stopped" in log and "Traceback" not in log


def test_a_bad_setting_stops_the_service_at_start_naming_it(tmp_path: Path) -> None:
    env = service_env(tmp_path / "state", SLUICE_CONTROL_PLANE_PORT="8080")
    done = subprocess.run(
        [sys.executable, "-m", "control_plane.service"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "control_plane_port (8080) must differ from gateway_port (8080)" in done.stderr
    assert "Traceback" not in done.stderr
