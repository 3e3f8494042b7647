"""The control plane's replica health checks are built from settings: a large model's cold start needs
more than the default 120 s of start grace, and an operator sets it (and the probe's deadline and the
interval) without code."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from pathlib import Path
from typing import ClassVar

import pytest

from control_plane.service import replicas as replica_services
from control_plane.service.metrics import ControlPlaneMetrics
from sluice.settings import Settings
from sluice.stores.registry.sqlite import SqliteRegistry


class RecordingFakeChecker:
    """A fake HealthChecker: records how it was built, checks nothing."""

    built: ClassVar[dict[str, object]] = {}
    launch_failed: ClassVar[object] = None

    def __init__(self, states: object, registry: object, **kwargs: object) -> None:
        RecordingFakeChecker.built = {k: v for k, v in kwargs.items() if k != "launch_failed"}
        RecordingFakeChecker.launch_failed = kwargs.get("launch_failed")

    async def start(self) -> None: ...

    async def close(self) -> None: ...


def test_the_health_checks_take_their_interval_deadline_and_grace_from_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_services, "HealthChecker", RecordingFakeChecker)
    settings = Settings(
        state_dir=tmp_path,
        checkpoint_dir=tmp_path,
        replica_health_interval_s=5,
        replica_probe_timeout_s=3,
        replica_start_grace_s=900,
    )

    async def open_services() -> None:
        registry = SqliteRegistry(tmp_path / "registry.db")
        await registry.open()
        try:
            async with AsyncExitStack() as stack:
                await replica_services.open_replica_services(settings, registry, ControlPlaneMetrics(), stack)
        finally:
            await registry.close()

    asyncio.run(open_services())
    assert RecordingFakeChecker.built == {"interval_s": 5, "start_grace_s": 900, "probe_timeout_s": 3}
    assert callable(RecordingFakeChecker.launch_failed)  # the actuator's: failed launches are left alone
