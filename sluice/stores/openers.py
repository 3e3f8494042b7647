"""Settings to stores: the one module that maps ``Settings`` to every store a process opens. Each
family's backend is chosen once, here, and logged at start, never by silent fallback:

==============  ================  ==============================  ===================================
family          chosen by         when set                        otherwise
==============  ================  ==============================  ===================================
usage ledger    ``database_url``  PostgreSQL                      SQLite ``<state_dir>/sluice.db``
tenants         ``database_url``  PostgreSQL                      SQLite, the same file
model registry  ``database_url``  PostgreSQL                      SQLite, the same file
batches         ``database_url``  PostgreSQL                      SQLite, the same file
admin tokens    ``database_url``  PostgreSQL                      SQLite, the same file
idempotency     ``redis_url``     Redis, shared by every gateway  in this process (one gateway)
quotas          ``redis_url``     Redis, failing open             in this process (one gateway)
files           ``files_url``     S3 ``s3://BUCKET/PREFIX``       the directory ``<state_dir>/files``
==============  ================  ==============================  ===================================

The SQL families share one choice, ``open_backend``. An unreachable PostgreSQL fails there, unless
``keep_trying`` (a server's start): then the store is returned unopened and opens in the background once
the server answers (``sluice.stores.db.MigratedPgPool``); until then it behaves as during an outage (tenant
lookups 503 or the last good view, usage kept in the outbox). An unreachable Redis or S3 never fails the
start; each opener says what its store does until it answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol, TypeVar, cast

from sluice.names import parse_files_url
from sluice.settings import Settings
from sluice.stores.admin_tokens.base import AdminTokenStore
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN_NAME, ensure_dev_admin_token
from sluice.stores.batches.base import BatchStore
from sluice.stores.db import describe_pg_url
from sluice.stores.files.base import ObjectStore
from sluice.stores.files.local import LocalObjectStore
from sluice.stores.files.s3 import S3ObjectStore
from sluice.stores.idempotency.base import IdempotencyStore
from sluice.stores.idempotency.inprocess import InProcessIdempotencyStore
from sluice.stores.ledger.base import UsageLedger
from sluice.stores.quota.base import QuotaStore
from sluice.stores.quota.failopen import FailOpenQuotaStore
from sluice.stores.quota.inprocess import InProcessQuotaStore
from sluice.stores.registry.base import Registry
from sluice.stores.tenants.base import TenantStore, seed_dev_tenants

log = logging.getLogger(__name__)

S = TypeVar("S")
AfterOpen = Callable[[], Awaitable[None]]


class _PgBackend(Protocol):
    """What every PostgreSQL backend's ``open`` takes (``sluice.stores.db.MigratedPgPool`` underneath)."""

    async def open(self, *, keep_trying: bool = False) -> None: ...


class _SeededPgBackend(Protocol):
    async def open(self, *, keep_trying: bool = False, after_open: AfterOpen | None = None) -> None: ...


class _SqliteBackend(Protocol):
    async def open(self) -> None: ...

    async def close(self) -> None: ...


async def open_backend(
    settings: Settings,
    what: str,
    postgres: Callable[[str], S],
    sqlite: Callable[[Path], S],
    *,
    keep_trying: bool = False,
    seed: Callable[[S], Awaitable[None]] | None = None,
) -> S:
    """The one choice of backend for every store family (``what`` names it in the log): PostgreSQL at
    ``settings.database_url`` when set, else the SQLite file ``settings.sqlite_path``; opened (migrated),
    then ``seed`` run on it. ``postgres`` / ``sqlite`` build the store (importing their backend only when
    chosen). With ``keep_trying`` an unreachable PostgreSQL does not fail here: the store opens, and is
    seeded, in the background."""
    if settings.database_url is not None:
        log.info("%s: PostgreSQL at %s", what, describe_pg_url(settings.database_url))
        pg_store = postgres(settings.database_url)
        if seed is None:
            await cast(_PgBackend, pg_store).open(keep_trying=keep_trying)
        else:
            after_open = seed
            await cast(_SeededPgBackend, pg_store).open(
                keep_trying=keep_trying, after_open=lambda: after_open(pg_store)
            )
        return pg_store
    log.info("%s: SQLite at %s", what, settings.sqlite_path)
    store = sqlite(settings.sqlite_path)
    await cast(_SqliteBackend, store).open()
    if seed is not None:
        try:
            await seed(store)
        except BaseException:
            await cast(_SqliteBackend, store).close()
            raise
    return store


async def open_ledger(
    settings: Settings, *, keep_trying: bool = False, report_outages: bool = True
) -> UsageLedger:
    """An opened (migrated) ledger, or with ``keep_trying`` one opening in the background; the caller
    closes it. ``report_outages=False``: its outages are logged by its caller (the gateway's usage meter),
    so the store's own report is a debug line (``sluice.outages``)."""

    def postgres(url: str) -> UsageLedger:
        from sluice.stores.ledger.store import PostgresLedger

        return PostgresLedger(
            url, pool_max_size=settings.database_pool_max_size, report_outages=report_outages
        )

    def sqlite(path: Path) -> UsageLedger:
        from sluice.stores.ledger.store import SqliteLedger

        return SqliteLedger(path, report_outages=report_outages)

    return await open_backend(settings, "usage ledger", postgres, sqlite, keep_trying=keep_trying)


async def open_tenant_store(
    settings: Settings, *, keep_trying: bool = False, report_outages: bool = True
) -> TenantStore:
    """An opened (migrated) tenant store, with the dev tenants seeded if ``settings.dev_tenants``, or with
    ``keep_trying`` one opening (and seeding) in the background; the caller closes it.
    ``report_outages=False``: its outages are logged by its caller (the gateway's tenant cache)."""

    def postgres(url: str) -> TenantStore:
        from sluice.stores.tenants.store import PostgresTenantStore

        return PostgresTenantStore(
            url, pool_max_size=settings.database_pool_max_size, report_outages=report_outages
        )

    def sqlite(path: Path) -> TenantStore:
        from sluice.stores.tenants.store import SqliteTenantStore

        return SqliteTenantStore(path, report_outages=report_outages)

    async def seed(store: TenantStore) -> None:
        if settings.dev_tenants:
            await seed_dev_tenants(store)
            log.info("tenant store: dev tenants seeded (acme, globex)")

    return await open_backend(settings, "tenant store", postgres, sqlite, keep_trying=keep_trying, seed=seed)


async def open_registry(settings: Settings, *, keep_trying: bool = False) -> Registry:
    """An opened (migrated) registry; the caller closes it. ``keep_trying`` (a server's start): an
    unreachable PostgreSQL does not fail here, the registry opens in the background and raises
    ``RegistryUnavailable`` until then (``sluice.stores.db.MigratedPgPool``); without it, it fails at once."""

    def postgres(url: str) -> Registry:
        from sluice.stores.registry.postgres import PostgresRegistry

        return PostgresRegistry(url, pool_max_size=settings.database_pool_max_size)

    def sqlite(path: Path) -> Registry:
        from sluice.stores.registry.sqlite import SqliteRegistry

        return SqliteRegistry(path)

    return await open_backend(settings, "model registry", postgres, sqlite, keep_trying=keep_trying)


async def open_batch_store(settings: Settings, *, keep_trying: bool = False) -> BatchStore:
    """An opened (migrated) batch store, or with ``keep_trying`` one opening in the background (until then
    it raises ``BatchStoreUnavailable``); the caller closes it. An unreachable PostgreSQL without
    ``keep_trying`` raises ``BatchStoreUnavailable`` here."""

    def postgres(url: str) -> BatchStore:
        from sluice.stores.batches.store import PostgresBatchStore

        return PostgresBatchStore(url, pool_max_size=settings.database_pool_max_size)

    def sqlite(path: Path) -> BatchStore:
        from sluice.stores.batches.store import SqliteBatchStore

        return SqliteBatchStore(path)

    return await open_backend(settings, "batch store", postgres, sqlite, keep_trying=keep_trying)


async def open_admin_token_store(settings: Settings, *, keep_trying: bool = False) -> AdminTokenStore:
    """An opened (migrated) admin token store, with the dev admin token seeded if
    ``settings.dev_tenants``, or with ``keep_trying`` (the control plane service's start) one opening (and
    seeding) in the background, every call raising ``AdminTokenStoreUnavailable`` until then; the caller
    closes it. Without ``keep_trying`` (the CLI) an unreachable PostgreSQL fails here."""

    def postgres(url: str) -> AdminTokenStore:
        from sluice.stores.admin_tokens.store import PostgresAdminTokenStore

        return PostgresAdminTokenStore(url)

    def sqlite(path: Path) -> AdminTokenStore:
        from sluice.stores.admin_tokens.store import SqliteAdminTokenStore

        return SqliteAdminTokenStore(path)

    async def seed(store: AdminTokenStore) -> None:
        await _seed_dev_admin_token(store, settings)

    return await open_backend(
        settings, "admin token store", postgres, sqlite, keep_trying=keep_trying, seed=seed
    )


async def _seed_dev_admin_token(store: AdminTokenStore, settings: Settings) -> None:
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


async def open_idempotency_store(settings: Settings) -> IdempotencyStore:
    """An opened idempotency store; the caller closes it. Redis (shared by every gateway, so a retry
    landing on another gateway still finds its key) when ``redis_url`` is set, else in this process's
    memory. An unreachable Redis does not fail the start (logged): requests with an Idempotency-Key get
    503 until it answers."""
    store: IdempotencyStore
    if settings.redis_url is not None:
        from sluice.stores.idempotency.redis import RedisIdempotencyStore

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


async def open_quota_store(settings: Settings, on_fail_open: Callable[[], None] | None = None) -> QuotaStore:
    """An opened quota store; the caller closes it. Redis (shared by every gateway) when ``redis_url`` is
    set, else in this process's memory. An unreachable Redis does not fail the start: it starts the
    fail-open window of ``quota_fail_open_s`` (logged). ``on_fail_open`` counts acquires answered without
    Redis."""
    store: QuotaStore
    if settings.redis_url is not None:
        from sluice.stores.quota.redis import RedisQuotaStore

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


async def open_object_store(settings: Settings) -> ObjectStore:
    """An opened object store for files; the caller closes it. ``files_url`` unset: a directory under the
    state directory (``<state_dir>/files``); ``s3://BUCKET/PREFIX``: that bucket (endpoint
    ``s3_endpoint_url``). An unreachable S3 does not fail the start: file requests get 503 until it
    answers."""
    store: ObjectStore
    if settings.files_url is None:
        store = LocalObjectStore(settings.state_dir / "files")
        log.info("files: in the directory %s", store.root)
    else:
        bucket, prefix = parse_files_url(settings.files_url)
        store = S3ObjectStore(bucket, prefix, endpoint_url=settings.s3_endpoint_url)
        log.info("files: in s3://%s/%s (endpoint %s)", bucket, prefix, settings.s3_endpoint_url or "AWS")
    await store.open()
    return store
