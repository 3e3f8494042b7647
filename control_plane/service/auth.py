"""Admin authentication and roles, as one Litestar guard: ``Authorization: Bearer sladm-...`` → the
principal (``request.state.principal``), then its role against the least role the route declares.

Every admin route declares its least role with ``opt=needs(Role.X)``; ``check_roles_declared`` refuses,
at start, an admin route that forgot to. Only the admin token store is asked: a tenant API key is no
admin token (401), whatever the tenant store says about it. Runs before the body is parsed, so an
unauthenticated caller learns nothing about its request's validity.
"""

from __future__ import annotations

from typing import Any

from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.routes import HTTPRoute

from control_plane.service.errors import insufficient_role, invalid_admin_token, unavailable
from control_plane.service.metrics import ADMIN_PATH_PREFIX
from control_plane.service.state import state_of
from sluice.stores.admin_tokens.base import TOKEN_PREFIX, AdminPrincipal, AdminTokenStoreUnavailable
from sluice.stores.admin_tokens.roles import Role, role_allows

MIN_ROLE = "min_role"
SECURITY_SCHEME = "AdminToken"


def needs(role: Role) -> dict[str, Any]:
    """A route handler's ``opt``: the least role that may call it."""
    return {MIN_ROLE: role}


def bearer_token(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    scheme, _sep, token = connection.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def require_admin(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
    """401 without a valid admin token, 403 for a role below the route's, 503 if the store is down."""
    needed: Role = handler.opt[MIN_ROLE]  # present: check_roles_declared ran at start
    cp = state_of(connection)
    token = bearer_token(connection)
    try:
        principal = await cp.tokens.resolve(token) if token else None
    except AdminTokenStoreUnavailable as exc:
        raise unavailable("admin token store", "admin_token_store_unavailable") from exc
    if principal is None:
        reason = "no_token" if not token else "unknown_token"
        if token and not token.startswith(TOKEN_PREFIX):
            reason = "not_admin_token"
        cp.metrics.auth_refusals.labels(reason).inc()
        raise invalid_admin_token(token)
    connection.state.principal = principal
    if not role_allows(principal.role, needed):
        cp.metrics.auth_refusals.labels("insufficient_role").inc()
        raise insufficient_role(principal.name, principal.role, needed)


def principal_of(connection: ASGIConnection[Any, Any, Any, Any]) -> AdminPrincipal:
    principal: AdminPrincipal = connection.state.principal
    return principal


def check_roles_declared(app: Litestar) -> None:
    """Every handler under ``/admin/`` is guarded by ``require_admin`` and declares its least role; a
    route that does not is a programming error, refused before the app serves anything."""
    for route in app.routes:
        if not route.path.startswith(ADMIN_PATH_PREFIX):
            continue
        handlers = route.route_handlers if isinstance(route, HTTPRoute) else [route.route_handler]
        for handler in handlers:
            if getattr(handler, "http_methods", None) == {"OPTIONS"}:
                continue  # Litestar's own OPTIONS answer: the allowed methods, nothing else
            declared = handler.opt.get(MIN_ROLE)
            if not isinstance(declared, Role) or require_admin not in handler.resolve_guards():
                raise RuntimeError(
                    f"admin route {route.path} ({handler.handler_name}) must be guarded by require_admin "
                    f"and declare its least role: opt=needs(Role.X)"
                )
