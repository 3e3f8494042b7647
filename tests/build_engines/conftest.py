"""Fixtures for the engine-build pipeline's tests: moto's S3 server on 127.0.0.1 (tests/s3_server.py),
the dev checkpoint uploaded there as a source, the control plane as a real process (its registry in
its own SQLite file) and a clean environment pointing the in-process CLI at both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from build_service import control_plane  # noqa: F401  (fixtures, found by name)
from s3_server import MotoS3, moto_s3, s3_bucket  # noqa: F401

from sluice.settings import get_settings
from sluice.weight_store import WeightStore


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
