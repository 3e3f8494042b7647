"""``python -m control_plane.service`` as an operator starts it: a real process on the port settings
give, its log as a person reads it, SIGTERM ending it cleanly; and a bad setting refused at start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from ports import free_port

from sluice.admin_tokens.dev import DEV_ADMIN_TOKEN

REPO = Path(__file__).resolve().parents[2]


def service_env(state_dir: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SLUICE_")}
    env.update({"SLUICE_STATE_DIR": str(state_dir), **settings})
    return env


def test_the_service_serves_on_its_port_logs_readably_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = service_env(tmp_path / "state", SLUICE_CONTROL_PLANE_PORT=str(port), SLUICE_DEV_TENANTS="true")
    log_path = tmp_path / "service.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.service"],
            cwd=REPO,
            env=env,
            stdout=log_file,
            stderr=log_file,
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log_path.read_text()
            try:
                if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        headers = {"Authorization": f"Bearer {DEV_ADMIN_TOKEN}"}
        assert httpx.get(f"{base_url}/admin/v1/whoami", headers=headers).json()["role"] == "platform-admin"
        assert httpx.get(f"{base_url}/admin/v1/whoami").status_code == 401
        assert httpx.get(f"{base_url}/readyz").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
    log = log_path.read_text()
    # uvicorn re-raises the signal it stopped for once shut down, so a clean stop exits by SIGTERM.
    assert code in (0, -signal.SIGTERM), log
    assert "Application shutdown complete" in log
    assert f"control plane up on http://127.0.0.1:{port}" in log
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
