"""The expired-file sweep (``gateway.files.sweeper``): a gateway deletes an expired file's objects within
``SLUICE_FILE_SWEEP_INTERVAL_S`` and counts it (``sluice_gateway_files_expired_total``), leaving files not
expired alone; one log line per sweep that deleted something, none otherwise; a store that cannot answer
is a warning and the next sweep tries again."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from expired_files import expire_now, stored_keys
from fakes import ScriptedFakeEngine
from harness import start_gateway, wait_until

from gateway.files.sweeper import FileSweeper
from sluice.settings import Settings
from sluice.stores.files.base import ObjectStoreUnavailable
from sluice.stores.files.catalog import FileCatalog, StoredFile
from sluice.stores.files.local import LocalObjectStore

LINES = b'{"custom_id": "a"}\n'
HOUR = {"anchor": "created_at", "seconds": 3600}


def test_a_gateway_sweeps_expired_files_and_counts_them(
    dev_checkpoint: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    running = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=ScriptedFakeEngine(token_id=5, interval_s=0.001),
        file_sweep_interval_s=0.2,
    )
    try:
        client = running.client()
        expiring = client.files.create(file=("a.jsonl", LINES), purpose="batch", expires_after=HOUR)  # type: ignore[arg-type]
        later = client.files.create(file=("b.jsonl", LINES), purpose="batch", expires_after=HOUR)  # type: ignore[arg-type]
        forever = client.files.create(file=("c.jsonl", LINES), purpose="batch")
        with caplog.at_level(logging.INFO, logger="gateway.files.sweeper"):
            expire_now(running.state_dir, expiring.id)
            wait_until(
                lambda: f"files/acme/{expiring.id}" not in stored_keys(running.state_dir), 10, "the sweep"
            )
        assert stored_keys(running.state_dir) == sorted(
            f"files/acme/{f.id}{suffix}" for f in (later, forever) for suffix in ("", ".json")
        )
        metric = running.gw.metrics.registry.get_sample_value("sluice_gateway_files_expired_total")
        assert metric == 1.0
        swept = [r.getMessage() for r in caplog.records if r.name == "gateway.files.sweeper"]
        assert swept == [
            "file sweep: deleted 1 expired files (acme 1)"
        ]  # sweeps that deleted nothing: silent
    finally:
        running.stop()


class Unreachable(LocalObjectStore):
    async def list(self, prefix: str) -> list[str]:
        raise ObjectStoreUnavailable("s3 down")


def test_a_store_that_cannot_answer_ends_the_sweep_and_the_next_sweep_tries_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counted: list[int] = []
    sweeper = FileSweeper(FileCatalog(Unreachable(tmp_path)), 60.0, on_expired=counted.append)
    # At DEBUG: the store reports its own outage once (tests/core/test_object_store.py), not each sweep.
    with caplog.at_level(logging.DEBUG, logger="gateway.files.sweeper"):
        assert asyncio.run(sweeper.sweep_once()) == 0
    assert counted == [] and "the file store is unavailable (s3 down)" in caplog.text


def test_the_loop_outlives_a_failed_sweep(tmp_path: Path) -> None:
    class Flaky(FileCatalog):
        calls = 0

        async def sweep_expired(self) -> list[StoredFile]:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise RuntimeError("a bug")
            return []

    async def run() -> None:
        sweeper = FileSweeper(Flaky(LocalObjectStore(tmp_path)), 0.01, on_expired=lambda n: None)
        await sweeper.start()
        for _ in range(500):
            if Flaky.calls >= 3:
                break
            await asyncio.sleep(0.01)
        await sweeper.close()

    asyncio.run(run())
    assert Flaky.calls >= 3


def test_the_sweep_interval_is_a_setting(tmp_path: Path) -> None:
    assert Settings(state_dir=tmp_path).file_sweep_interval_s == 600.0
    with pytest.raises(ValueError, match="file_sweep_interval_s"):
        Settings(state_dir=tmp_path, file_sweep_interval_s=0)
