"""The gateway's batch runner: claims batches with work left (``BatchStore.claim``) and works each
(``work.BatchWork``), at most ``max_active`` at once, so several tenants' batches queue side by side in
the models' fair queues. Every gateway runs one; the leases keep two from working one batch. A batch
whose lease lapses (its gateway died or lost the store) is claimed again by whichever runner looks next,
and resumes from its committed parts.

Batch lines are ordinary requests at the batch class: the scheduler gives them what interactive traffic
leaves (beyond the batch floor share), and the tenant's limits apply to them as to its other requests.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import socket
from contextlib import suppress
from datetime import UTC, datetime

from gateway.batches.work import BatchWork, Stores, WorkLimits
from gateway.state import GatewayState
from sluice.stores.batches.base import BatchError, BatchStatus, BatchStoreUnavailable, LeaseLost
from sluice.stores.files.base import ObjectStoreUnavailable
from sluice.stores.tenants.base import TenantStore, TenantStoreUnavailable, UnknownTenantError

log = logging.getLogger(__name__)


def runner_name() -> str:
    """This runner's lease owner: host, process and a random part (a restarted process is another
    owner), in the characters object keys allow."""
    raw = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    return re.sub(r"[^A-Za-z0-9_.=-]", "-", raw)[:96]


class BatchRunner:
    def __init__(
        self,
        gw: GatewayState,
        stores: Stores,
        tenants: TenantStore,
        limits: WorkLimits,
        *,
        max_active: int,
        poll_interval_s: float,
        drain_s: float,  # at a stop, how long the lines running may take to end before they are cut
    ) -> None:
        self.owner = runner_name()
        self._gw = gw
        self._stores = stores
        self._tenants = tenants
        self._limits = limits
        self._max_active = max_active
        self._poll_interval_s = poll_interval_s
        self._drain_s = drain_s
        self._active: dict[str, tuple[BatchWork, asyncio.Task[None]]] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        gw.metrics.batches_active.set_function(lambda: len(self._active))

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._claim_loop(), name="batch-runner")
        log.info(
            "batch runner %s: up to %d batches at once, %d lines each",
            self.owner,
            self._max_active,
            self._limits.line_concurrency,
        )

    def wake(self) -> None:
        """A batch was created (or let go): look for work now rather than at the next poll."""
        self._wake.set()

    def cancel_requested(self, batch_id: str) -> None:
        """The API set ``batch_id`` CANCELLING: if this runner works it, stop its lines now."""
        active = self._active.get(batch_id)
        if active is not None:
            active[0].cancel_requested()

    async def close(self) -> None:
        """Stop claiming and stop every batch: no line starts any more, those running get up to
        ``drain_s`` to end (then they are cut, to run again where the batch resumes, the cut runs billing
        nothing), what ended is committed, and the leases are given back, so a runner elsewhere (or this
        one restarted) resumes the batches at once."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._loop_task
        works = list(self._active.values())
        for work, _ in works:
            work.drain()
        tasks = [task for _, task in works]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self._drain_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for work, _ in works:
            with suppress(Exception):
                await self._stores.batches.release(work.batch.batch_id, self.owner)

    async def _claim_loop(self) -> None:
        while True:
            self._wake.clear()
            while len(self._active) < self._max_active:
                try:
                    batch = await self._stores.batches.claim(
                        self.owner, self._limits.lease_s, datetime.now(UTC)
                    )
                except BatchStoreUnavailable as exc:
                    # NOTE: the store reports its outage once each way (sluice.outages); not each retry.
                    log.debug("batch runner: the batch store is unavailable (%s); retrying", exc)
                    break
                if batch is None:
                    break
                work = BatchWork(batch, self.owner, self._gw, self._stores, self._limits)
                task = asyncio.create_task(self._work(work), name=f"batch-{batch.batch_id}")
                self._active[batch.batch_id] = (work, task)
            with suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval_s):
                    await self._wake.wait()

    async def _work(self, work: BatchWork) -> None:
        batch_id = work.batch.batch_id
        log.info("batch %s (%s): claimed at status %s", batch_id, work.batch.tenant_id, work.batch.status)
        try:
            try:
                tenant = await self._tenants.get(work.batch.tenant_id)
            except UnknownTenantError:
                error = BatchError("tenant_not_found", "The batch's tenant no longer exists.")
                await self._stores.batches.advance(
                    batch_id, self.owner, BatchStatus.FAILED, datetime.now(UTC), errors=(error,)
                )
                return
            await work.run(tenant)
        except LeaseLost:
            log.warning("batch %s: another runner holds it now", batch_id)
        except (BatchStoreUnavailable, ObjectStoreUnavailable, TenantStoreUnavailable) as exc:
            # Its lease lapses and it is claimed again then (by any runner): the wait is the backoff.
            log.warning("batch %s paused: %s; it resumes once its lease lapses", batch_id, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("batch %s failed in the runner; it resumes once its lease lapses", batch_id)
        finally:
            self._active.pop(batch_id, None)
            self._wake.set()
