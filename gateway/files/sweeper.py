"""Deletes expired files (``FileCatalog.sweep_expired``) every ``SLUICE_FILE_SWEEP_INTERVAL_S`` on each
gateway. An expired file is already unknown to every read: the sweep only frees its objects, so a sweep
missed (the store down, the gateway stopped) costs space, not correctness, and sweeps on several gateways
at once are harmless. Logs one line per sweep that deleted something (tenants and counts, never names)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from contextlib import suppress

from sluice.stores.files.base import ObjectStoreUnavailable
from sluice.stores.files.catalog import FileCatalog

log = logging.getLogger(__name__)


class FileSweeper:
    def __init__(self, files: FileCatalog, interval_s: float, on_expired: Callable[[int], object]) -> None:
        """``on_expired(n)``: told how many files each sweep deleted (the metric)."""
        self._files = files
        self._interval_s = interval_s
        self._on_expired = on_expired
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="file-sweeper")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep_once(self) -> int:
        """One sweep; the number of files it deleted (0 when the store could not be reached)."""
        try:
            expired = await self._files.sweep_expired()
        except ObjectStoreUnavailable as exc:
            # NOTE: the store reports its outage once each way (sluice.stores.files.base.reported).
            log.debug("file sweep: the file store is unavailable (%s); trying again next sweep", exc)
            return 0
        if expired:
            per_tenant = Counter(f.tenant_id for f in expired)
            log.info(
                "file sweep: deleted %d expired files (%s)",
                len(expired),
                ", ".join(f"{tenant} {n}" for tenant, n in sorted(per_tenant.items())),
            )
            self._on_expired(len(expired))
        return len(expired)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.sweep_once()
            except Exception:  # a bug here must not end the sweeping for the process's life
                log.exception("file sweep failed; trying again next sweep")
