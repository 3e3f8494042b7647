"""Run the gateway for tests: uvicorn in a background thread on a free port, with real settings, the real
storage they name (SQLite under a temporary state_dir), and the engine client the test asks for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import uvicorn
from litestar import Litestar
from ports import free_port

from cpu_engine.client import InProcessEngineClient
from gateway.app import create_app
from gateway.serving import uvicorn_config
from gateway.state import GatewayState
from sluice.engine_client import Delta, EngineClient, GenerateRequest
from sluice.settings import Settings

ACME_KEY = "sk-acme-dev"
GLOBEX_KEY = "sk-globex-dev"
MODEL = "sluice-tiny"


@dataclass
class RunningGateway:
    app: Litestar
    server: uvicorn.Server
    thread: threading.Thread
    base_url: str
    state_dir: Path

    @property
    def gw(self) -> GatewayState:
        gw: GatewayState = self.app.state.gw
        return gw

    def client(self, api_key: str = ACME_KEY, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=api_key, max_retries=0, **kwargs)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=30)

    def usage(self, api_key: str = ACME_KEY, **params: str) -> dict[str, Any]:
        with self.http() as http:
            resp = http.get("/v1/usage", params=params, headers={"Authorization": f"Bearer {api_key}"})
        resp.raise_for_status()
        body: dict[str, Any] = resp.json()
        return body

    def usage_row(self, request_id: str, api_key: str = ACME_KEY, timeout_s: float = 5.0) -> dict[str, Any]:
        """The ledger row of ``request_id`` (written in the request's ``finally``, maybe just after the
        response ended), through GET /v1/usage."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = {r["request_id"]: r for r in self.usage(api_key=api_key, limit="1000")["data"]}
            if request_id in rows:
                return rows[request_id]
            if time.monotonic() > deadline:
                raise AssertionError(f"no usage row for {request_id}")
            time.sleep(0.02)

    def telemetry(self) -> list[dict[str, Any]]:
        """Every telemetry record so far (the writer's queue flushed first)."""
        self.gw.telemetry.flush()
        path = self.gw.settings.telemetry_path
        if path is None or not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class RecordingEngine(InProcessEngineClient):
    """The in-process engine, keeping the requests it was given (to see what reached the engine)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[GenerateRequest] = []

    def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        self.requests.append(request)
        return super().generate(request)


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    """Poll ``cond`` every ``poll_s`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll_s)


def start_gateway(
    state_dir: Path, checkpoint_dir: Path, engine: EngineClient | None = None, **overrides: Any
) -> RunningGateway:
    """Start a gateway, served as ``python -m gateway`` serves it (gateway.serving), with the dev tenants
    unless ``dev_tenants=False``; ``engine`` None means the one ``overrides['engine_client']`` names."""
    port = free_port()
    settings = Settings(
        state_dir=state_dir,
        checkpoint_dir=checkpoint_dir,
        gateway_host="127.0.0.1",
        gateway_port=port,
        **{"engine_client": "inprocess", "tenant_cache_ttl_s": 5.0, "dev_tenants": True, **overrides},
    )
    app = create_app(settings, engine=engine)  # storage from settings: SQLite under state_dir
    server = uvicorn.Server(uvicorn_config(app, settings, uvicorn_log_level="warning"))
    thread = threading.Thread(target=server.run, name=f"gateway-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the gateway did not start")
        time.sleep(0.02)
    return RunningGateway(app, server, thread, f"http://127.0.0.1:{port}", state_dir)


REPO = Path(__file__).resolve().parents[2]


@dataclass
class GatewayProcess:
    """``python -m gateway`` as a process of its own (to be killed as a real gateway dies)."""

    proc: subprocess.Popen[bytes]
    base_url: str
    log: Path


@contextmanager
def gateway_process(
    state_dir: Path, checkpoint_dir: Path, log_name: str = "gateway", **env: str
) -> Iterator[GatewayProcess]:
    """A gateway process over the in-process engine and the state under ``state_dir`` (its log in
    ``<state_dir>/<log_name>.log``), the dev tenants on, ``env`` added as ``SLUICE_<NAME>`` variables;
    yielded once it serves, killed (if still running) at the end."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    environ.update(
        SLUICE_STATE_DIR=str(state_dir),
        SLUICE_CHECKPOINT_DIR=str(checkpoint_dir),
        SLUICE_ENGINE_CLIENT="inprocess",
        SLUICE_DEV_TENANTS="true",
        SLUICE_GATEWAY_HOST="127.0.0.1",
        SLUICE_GATEWAY_PORT=str(port),
        **{f"SLUICE_{name.upper()}": value for name, value in env.items()},
    )
    log_path = state_dir / f"{log_name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway"], cwd=REPO, env=environ, stdout=log, stderr=log
        )
        gateway = GatewayProcess(proc, f"http://127.0.0.1:{port}", log_path)
        try:
            _wait_until_serving(gateway)
            yield gateway
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def _wait_until_serving(gateway: GatewayProcess) -> None:
    deadline = time.monotonic() + 60
    auth = {"Authorization": f"Bearer {ACME_KEY}"}
    while True:
        assert gateway.proc.poll() is None, f"the gateway exited:\n{gateway.log.read_text()}"
        try:
            if httpx.get(f"{gateway.base_url}/v1/models", headers=auth, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"the gateway did not start:\n{gateway.log.read_text()}"
        time.sleep(0.05)
