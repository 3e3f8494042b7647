"""The control plane as a real process for the build tests (tests/control_plane_process.py: ``python -m
control_plane.service`` on a free port, its registry in its own SQLite file, the dev admin token on)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from control_plane_process import RunningControlPlane, running_control_plane

ControlPlane = RunningControlPlane  # the name the build tests annotate with


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """``python -m control_plane.service`` on a free port with the dev admin token (platform-admin)."""
    with running_control_plane(tmp_path_factory.mktemp("cp") / "state") as running:
        yield running
