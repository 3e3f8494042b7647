"""Which quota store runs, chosen once from settings: Redis (shared by every gateway, failing open for
``quota_fail_open_s``) when ``redis_url`` is set, else in this process's memory (one gateway)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sluice.quota.base import QuotaStore
from sluice.quota.failopen import FailOpenQuotaStore
from sluice.quota.inprocess import InProcessQuotaStore
from sluice.settings import Settings

log = logging.getLogger(__name__)


async def open_quota_store(settings: Settings, on_fail_open: Callable[[], None] | None = None) -> QuotaStore:
    """An opened quota store; the caller closes it. An unreachable Redis does not fail the start: it starts
    the fail-open window (logged). ``on_fail_open`` counts acquires answered without Redis."""
    store: QuotaStore
    if settings.redis_url is not None:
        from sluice.quota.redis import RedisQuotaStore

        log.info("quota store: Redis (fail-open for %g s)", settings.quota_fail_open_s)
        store = FailOpenQuotaStore(
            RedisQuotaStore(settings.redis_url, key_prefix=f"{settings.redis_key_prefix}quota:"),
            InProcessQuotaStore(),
            window_s=settings.quota_fail_open_s,
            on_fail_open=on_fail_open,
        )
    else:
        log.info("quota store: in-process (one gateway)")
        store = InProcessQuotaStore()
    await store.open()
    return store
