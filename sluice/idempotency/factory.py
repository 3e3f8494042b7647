"""Which idempotency store runs, chosen once from settings: Redis (shared by every gateway, so a retry
landing on another gateway still finds its key) when ``redis_url`` is set, else in this process's memory."""

from __future__ import annotations

import logging

from sluice.idempotency.base import IdempotencyStore
from sluice.idempotency.inprocess import InProcessIdempotencyStore
from sluice.settings import Settings

log = logging.getLogger(__name__)


async def open_idempotency_store(settings: Settings) -> IdempotencyStore:
    """An opened idempotency store; the caller closes it. An unreachable Redis does not fail the start
    (logged): requests with an Idempotency-Key get 503 until it answers."""
    store: IdempotencyStore
    if settings.redis_url is not None:
        from sluice.idempotency.redis import RedisIdempotencyStore

        log.info("idempotency store: Redis")
        store = RedisIdempotencyStore(
            settings.redis_url,
            key_prefix=f"{settings.redis_key_prefix}idem:",
            max_records_per_tenant=settings.idempotency_max_records_per_tenant,
        )
    else:
        log.info("idempotency store: in-process (one gateway)")
        store = InProcessIdempotencyStore(settings.idempotency_max_records_per_tenant)
    await store.open()
    return store
