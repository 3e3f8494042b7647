"""The autoscaler in the control plane service (the app's real lifespan, SQLite): off by default; with
SLUICE_AUTOSCALER=on it scrapes the gateway metrics URL it is given (here a fake gateway: an HTTP server
serving the gateway's own GatewayMetrics text) and exports its decisions on the control plane's /metrics;
contradictory bounds fail at start, naming the variables."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from litestar.testing import TestClient

from control_plane.autoscaler.local import LocalActuator
from control_plane.autoscaler.service import autoscale_config, gateway_metrics_urls
from control_plane.service.app import create_app
from gateway.metrics import GatewayMetrics
from sluice.settings import SettingsError, load_settings
from sluice.stores.registry.base import VersionState
from sluice.stores.registry.sqlite import SqliteRegistry

MODEL = "sluice-tiny"
ACTOR = "test"


@pytest.fixture
def fake_gateway() -> Iterator[str]:
    """A fake gateway's /metrics: what a real gateway renders before any request."""
    body = GatewayMetrics().render()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def routed_version(sqlite_path: Path) -> None:
    async def run() -> None:
        registry = SqliteRegistry(sqlite_path)
        await registry.open()
        try:
            await registry.create_model(MODEL, actor=ACTOR)
            await registry.add_version(
                MODEL, "1", artifact_uri="file:///x", weights_digest="sha256:" + "1" * 64,
                build_config={}, actor=ACTOR,
            )  # fmt: skip
            await registry.set_version_state(MODEL, "1", VersionState.WARMING, actor=ACTOR)
            await registry.set_version_state(MODEL, "1", VersionState.SERVING, actor=ACTOR)
            await registry.set_route(MODEL, {"1": 10_000}, actor=ACTOR)
        finally:
            await registry.close()

    asyncio.run(run())


def test_off_by_default(clean_env: Path) -> None:
    with TestClient(create_app(load_settings())) as client:
        assert client.app.state.cp.autoscaler is None
        assert b"sluice_control_plane_autoscaler" not in client.get("/metrics").content


def test_on_it_scrapes_the_gateways_and_exports_each_decision(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, fake_gateway: str
) -> None:
    for name, value in {
        "SLUICE_AUTOSCALER": "on",
        "SLUICE_AUTOSCALER_GATEWAY_METRICS_URLS": fake_gateway,
        "SLUICE_AUTOSCALER_INTERVAL_S": "0.5",
        "SLUICE_AUTOSCALER_MIN_REPLICAS": "0",  # so that it starts no tritonserver here
        "SLUICE_AUTOSCALER_WARM_POOL_REPLICAS": "0",
    }.items():
        monkeypatch.setenv(name, value)
    settings = load_settings()
    routed_version(settings.sqlite_path)
    hold = (
        'sluice_control_plane_autoscaler_decisions_total{direction="hold",model="sluice-tiny",'
        'reason="calm_in_cooldown",version="1"}'
    )
    with TestClient(create_app(settings)) as client:
        assert isinstance(client.app.state.cp.autoscaler.actuator, LocalActuator)
        deadline = time.monotonic() + 20.0
        while hold not in client.get("/metrics").text and time.monotonic() < deadline:
            time.sleep(0.2)
        text = client.get("/metrics").text
        assert hold in text
        assert 'sluice_control_plane_autoscaler_desired_replicas{model="sluice-tiny",version="1"} 0.0' in text


def test_min_above_max_is_refused_naming_both(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_AUTOSCALER", "on")
    monkeypatch.setenv("SLUICE_AUTOSCALER_MIN_REPLICAS", "5")
    monkeypatch.setenv("SLUICE_AUTOSCALER_MAX_REPLICAS", "2")
    with pytest.raises(SettingsError, match=r"MIN_REPLICAS \(5\) must be <= SLUICE_AUTOSCALER_MAX_REPLICAS"):
        autoscale_config(load_settings())  # what the service's start calls
    monkeypatch.setenv("SLUICE_AUTOSCALER_GATEWAY_METRICS_URLS", "gateway:8080")
    with pytest.raises(SettingsError, match="SLUICE_AUTOSCALER_GATEWAY_METRICS_URLS"):
        gateway_metrics_urls(load_settings())
