"""Fixtures shared by every test folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpu_engine.devckpt import write_checkpoint


@pytest.fixture(scope="session")
def dev_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dev checkpoint (seed 0), written once per test session. Treat it as read-only."""
    return write_checkpoint(tmp_path_factory.mktemp("dev_checkpoint"), seed=0)
