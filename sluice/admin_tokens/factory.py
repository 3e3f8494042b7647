"""Which admin token store runs, chosen once from settings as ``sluice.storage`` chooses the tenant store:
PostgreSQL when ``database_url`` is set, else the SQLite file ``<state_dir>/sluice.db``. The choice is
logged, never made by silent fallback.

An unreachable PostgreSQL fails here (the CLI), unless ``keep_trying`` (the control plane service's
start): then the store is returned unopened and opens in the background once the server answers; until
then every call raises ``AdminTokenStoreUnavailable``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from sluice.admin_tokens.base import AdminTokenStore
from sluice.admin_tokens.dev import DEV_ADMIN_TOKEN_NAME, ensure_dev_admin_token
from sluice.settings import Settings
from sluice.storage import open_backend

log = logging.getLogger(__name__)


async def open_admin_token_store(settings: Settings, *, keep_trying: bool = False) -> AdminTokenStore:
    """An opened (migrated) admin token store, with the dev admin token seeded if
    ``settings.dev_tenants``, or with ``keep_trying`` one opening (and seeding) in the background; the
    caller closes it."""

    def postgres(url: str) -> AdminTokenStore:
        from sluice.admin_tokens.store import PostgresAdminTokenStore

        return PostgresAdminTokenStore(url)

    def sqlite(path: Path) -> AdminTokenStore:
        from sluice.admin_tokens.store import SqliteAdminTokenStore

        return SqliteAdminTokenStore(path)

    async def seed(store: AdminTokenStore) -> None:
        await _seed(store, settings)

    return await open_backend(
        settings, "admin token store", postgres, sqlite, keep_trying=keep_trying, seed=seed
    )


async def _seed(store: AdminTokenStore, settings: Settings) -> None:
    if not settings.dev_tenants:
        return
    if await ensure_dev_admin_token(store) is None:
        log.warning(
            "admin token store: the dev admin token %r was revoked; not seeding it", DEV_ADMIN_TOKEN_NAME
        )
    else:
        log.info("admin token store: dev admin token %r seeded", DEV_ADMIN_TOKEN_NAME)


def prepare_dev_admin_token(settings: Settings) -> str | None:
    """For the dev stack (``make run``), before it starts the services: the dev platform-admin token to
    print, seeded in the store settings name if missing; None when ``settings.dev_tenants`` is off or an
    operator revoked it. Runs its own event loop (call it outside one); ``AdminTokenStoreUnavailable``
    if the store cannot be reached."""
    if not settings.dev_tenants:
        return None

    async def run() -> str | None:
        store = await open_admin_token_store(settings)  # seeds it
        try:
            return await ensure_dev_admin_token(store)  # a no-op now: what it holds
        finally:
            await store.close()

    return asyncio.run(run())
