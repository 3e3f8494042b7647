"""``Authorization: Bearer <key>`` → the caller's tenant, as a Litestar guard (runs before the body is
parsed, so an unauthenticated caller learns nothing about the request's validity)."""

from __future__ import annotations

import time
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from gateway.errors import invalid_api_key
from gateway.state import GatewayState
from sluice.domain import Tenant


async def require_tenant(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    connection.state.arrival_s = time.monotonic()
    gw: GatewayState = connection.app.state.gw
    scheme, _sep, key = connection.headers.get("authorization", "").partition(" ")
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise invalid_api_key()
    tenant = await gw.tenants.resolve(key)
    if tenant is None:
        raise invalid_api_key()
    connection.state.tenant = tenant


def tenant_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Tenant:
    tenant: Tenant = connection.state.tenant
    return tenant
