"""A gateway follows the registry: it reads a snapshot, routes by it, and reads the next one as soon as
the generation moves (``Registry.wait_for_change``: PostgreSQL's LISTEN/NOTIFY, polling on SQLite or
while the listening connection is lost), so a change reaches it within about a second. Every
``poll_interval_s`` without a change it re-reads anyway and retries the replicas it could not verify.

The registry down: the gateway keeps routing by the last snapshot it read (stale, not stopped), counts
the failures, and tries again with a backoff; /readyz says how old its view is. The outage is logged by
the registry's store (once when it starts, once when it ends), not by each retry here. Before the first
snapshot it routes nothing (503 ``model_unavailable``) and is not ready.

Exported: ``sluice_gateway_registry_generation`` (the generation it routes by) and
``sluice_gateway_registry_read_failures_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from gateway.metrics import GatewayMetrics
from gateway.routing.router import Router
from gateway.routing.table import RoutingTable
from sluice.stores.registry.base import Registry, RegistryError, RegistryUnavailable

log = logging.getLogger(__name__)

# NOTE: while the registry's store is known down it refuses at once, so a read a second costs nothing, and
# the gateway follows again within a second of the database's return (issue 26).
_MAX_BACKOFF_S = 1.0


class RegistryFollower:
    def __init__(
        self, registry: Registry, router: Router, metrics: GatewayMetrics, poll_interval_s: float
    ) -> None:
        self._registry = registry
        self._router = router
        self._metrics = metrics
        self._poll_interval_s = poll_interval_s
        self._task: asyncio.Task[None] | None = None
        self.generation = -1  # the generation routed by; -1 before the first snapshot
        self.read_at_s: float | None = None  # time.monotonic() of the last successful read

    async def start(self) -> None:
        """One attempt at the first snapshot now (so a gateway starting beside a working registry routes
        from its first request), then follow in the background."""
        with contextlib.suppress(RegistryError, OSError):
            await self._read()
        self._task = asyncio.create_task(self._follow(), name="registry-follower")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def report(self) -> dict[str, object]:
        age_s = None if self.read_at_s is None else round(time.monotonic() - self.read_at_s, 1)
        return {"registry_generation": self.generation, "registry_read_age_s": age_s}

    async def _read(self) -> None:
        snapshot = await self._registry.snapshot()
        await self._router.apply(RoutingTable.from_snapshot(snapshot))
        if snapshot.generation != self.generation:
            log.info("routing by registry generation %d", snapshot.generation)
        self.generation = snapshot.generation
        self.read_at_s = time.monotonic()
        self._metrics.registry_generation.set(snapshot.generation)

    async def _follow(self) -> None:
        backoff_s = 0.5
        while True:
            try:
                if self.generation >= 0:
                    await self._registry.wait_for_change(self.generation, self._poll_interval_s)
                await self._read()
                backoff_s = 0.5
            except (RegistryError, OSError) as exc:
                self._metrics.registry_read_failures.inc()
                # NOTE: an outage is the registry store's to report, once each way (sluice.outages); the
                # retries are debug lines. Any other failure to read it is said each time.
                log.log(
                    logging.DEBUG if isinstance(exc, RegistryUnavailable) else logging.WARNING,
                    "registry unreadable (%s); routing by generation %d, retrying in %.1f s",
                    exc,
                    self.generation,
                    backoff_s,
                )
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, _MAX_BACKOFF_S)
            except Exception:  # a bug must not stop the gateway following the registry
                log.exception("following the registry failed; retrying")
                await asyncio.sleep(_MAX_BACKOFF_S)
