"""The control plane as an operator starts it, for the tests that need a real process:
``python -m control_plane.service`` on a free port, its registry in its own SQLite state folder, the dev
admin token (platform-admin) on, its log in a file beside the state folder; ready once /readyz says 200,
stopped by SIGTERM, and a clean stop (exit 0 or by SIGTERM, no traceback in its log) checked at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from ports import free_port

from sluice.settings import ENV_PREFIX, Settings, load_settings
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def service_env(state_dir: Path, **settings: str) -> dict[str, str]:
    """This process's environment without any SLUICE_* variable (the caller's shell may set some), then
    the state folder and ``settings`` (SLUICE_* names) set: what the service process is started with."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(ENV_PREFIX)}
    env.update({f"{ENV_PREFIX}STATE_DIR": str(state_dir), **settings})
    return env


@dataclass(frozen=True)
class RunningControlPlane:
    """A started control plane: its admin URL, state folder, the admin token it accepts, its log, and
    the SLUICE_* variables it was started with."""

    url: str
    state_dir: Path
    log_path: Path
    token: str = DEV_ADMIN_TOKEN
    env: tuple[tuple[str, str], ...] = ()

    def settings(self) -> Settings:
        """The service's own settings (its state folder, port and extra variables), read in this process;
        a SLUICE_* variable set here and not given to the service still shows through."""
        overrides = {name.removeprefix(ENV_PREFIX).lower(): value for name, value in self.env}
        return load_settings(**overrides)


@contextmanager
def running_control_plane(state_dir: Path, **extra_env: str) -> Iterator[RunningControlPlane]:
    """Start the service over ``state_dir`` (created by it when missing) with ``extra_env`` (SLUICE_*
    settings, or any other variable such as an S3 endpoint) and yield it once ready; stop it on leaving.
    Its log is ``state_dir.parent / "control_plane.log"``; a failed start or wait says what it holds."""
    port = free_port()
    settings_env = {
        f"{ENV_PREFIX}STATE_DIR": str(state_dir),
        f"{ENV_PREFIX}CONTROL_PLANE_PORT": str(port),
        f"{ENV_PREFIX}DEV_TENANTS": "true",
        **extra_env,
    }
    log_path = state_dir.parent / "control_plane.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "control_plane.service"],
            cwd=REPO,
            env=service_env(state_dir, **settings_env),
            stdout=log_file,
            stderr=log_file,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_ready(proc, url, log_path)
        yield RunningControlPlane(
            url=url,
            state_dir=state_dir,
            log_path=log_path,
            env=tuple((k, v) for k, v in settings_env.items() if k.upper().startswith(ENV_PREFIX)),
        )
    finally:
        exit_code = _stop(proc)
    log = log_path.read_text()
    # uvicorn re-raises the signal it stopped for once shut down, so a clean stop exits by SIGTERM.
    assert exit_code in (0, -signal.SIGTERM), log
    assert "Traceback" not in log, log


def _wait_until_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then its exit code; killed (and the wait's error raised) if it outlives the timeout."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
