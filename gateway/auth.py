"""``Authorization: Bearer <key>`` → the caller's tenant, as a Litestar guard (runs before the body is
parsed, so an unauthenticated caller learns nothing about the request's validity).

With the tenant store down, a key seen recently keeps working from the cache, and any other key gets 503
``tenant_store_unavailable`` with Retry-After, never 401: the gateway cannot tell whether it is valid.
"""

from __future__ import annotations

import time
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from gateway.errors import OpenAIError, invalid_api_key
from gateway.metrics import GatewayMetrics
from gateway.state import GatewayState
from sluice.domain import Tenant
from sluice.settings import Settings
from sluice.stores.tenants.base import TenantStore, TenantStoreUnavailable
from sluice.stores.tenants.cache import CachedTenantResolver, ResolverLimits


def tenant_resolver(store: TenantStore, settings: Settings, metrics: GatewayMetrics) -> CachedTenantResolver:
    """The gateway's resolver: bounds from settings, outages reported in the metrics."""
    limits = ResolverLimits(
        ttl_s=settings.tenant_cache_ttl_s,
        unknown_ttl_s=settings.tenant_unknown_ttl_s,
        stale_max_s=settings.tenant_stale_max_s,
        probe_interval_s=settings.tenant_store_probe_interval_s,
        lookup_timeout_s=settings.tenant_lookup_timeout_s,
        max_concurrent_lookups=settings.tenant_max_concurrent_lookups,
    )
    return CachedTenantResolver(
        store,
        limits,
        on_stale=metrics.tenant_stale_resolutions.inc,
        on_store_down=lambda down: metrics.tenant_store_down.set(1 if down else 0),
        on_lookup=metrics.tenant_store_lookups.inc,
    )


async def require_tenant(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    connection.state.arrival_s = time.monotonic()
    gw: GatewayState = connection.app.state.gw
    scheme, _sep, key = connection.headers.get("authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise invalid_api_key()
    try:
        tenant = await gw.tenants.resolve(key)
    except TenantStoreUnavailable as exc:
        raise tenant_store_unavailable(exc.retry_after_s) from exc
    if tenant is None:
        raise invalid_api_key()
    connection.state.tenant = tenant


def tenant_store_unavailable(retry_after_s: float | None) -> OpenAIError:
    return OpenAIError(
        503,
        "The API key could not be checked: the tenant store is unavailable. Retry later.",
        type="server_error",
        code="tenant_store_unavailable",
        retry_after_s=max(1.0, retry_after_s or 1.0),
    )


def tenant_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Tenant:
    tenant: Tenant = connection.state.tenant
    return tenant
