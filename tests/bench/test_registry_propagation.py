"""The registry-propagation bench measures what it says: one delay per change and follower, each the
time to a follower routing by that change (on SQLite here; the bench also runs PostgreSQL)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bench.registry_propagation import measure
from sluice.stores.registry.sqlite import SqliteRegistry


def test_every_follower_gets_every_change_within_a_second(tmp_path: Path) -> None:
    path = tmp_path / "sluice.db"
    delays_ms = asyncio.run(measure(lambda: SqliteRegistry(path), num_followers=2, num_changes=3, gap_s=0.05))
    assert len(delays_ms) == 2 * 3
    assert all(0 <= d < 1000 for d in delays_ms), delays_ms
