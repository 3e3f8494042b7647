"""``/admin/v1``: who am I (viewer), and admin token management (platform-admin).

A token is shown once, in the response that creates it; lists show its name, role, a short prefix and
its times, never the token or its hash. Creating and revoking are logged with who did it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import msgspec
from litestar import Controller, Request, delete, get, post
from litestar.params import FromPath, JSONBody

from control_plane.service.auth import SECURITY_SCHEME, needs, principal_of, require_admin
from control_plane.service.errors import AdminError, error_responses, unavailable
from control_plane.service.state import state_of
from sluice.stores.admin_tokens.base import (
    AdminToken,
    AdminTokenExistsError,
    AdminTokenStoreUnavailable,
    UnknownAdminTokenError,
    token_prefix,
)
from sluice.stores.admin_tokens.roles import ROLES_BY_RANK, Role, role_allows

log = logging.getLogger("sluice.control_plane")

TOKEN_SHOWN_ONCE = "This token is shown only now: store it safely (Sluice keeps only its hash)."


class WhoAmI(msgspec.Struct):
    name: str
    role: Role
    roles_covered: list[Role]  # every role whose operations this token may call


class CreateTokenBody(msgspec.Struct, forbid_unknown_fields=True):
    name: str  # 1-63 of a-z 0-9 . _ @ -, unique among active tokens
    role: Role


class CreatedToken(msgspec.Struct):
    name: str
    role: Role
    token: str  # shown only in this response
    token_prefix: str
    note: str


class TokenView(msgspec.Struct):
    name: str
    role: Role
    token_prefix: str
    active: bool
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


def token_view(token: AdminToken) -> TokenView:
    return TokenView(
        name=token.name,
        role=token.role,
        token_prefix=token.token_prefix,
        active=token.active,
        created_at=token.created_at,
        last_used_at=token.last_used_at,
        revoked_at=token.revoked_at,
    )


def _store_down(exc: AdminTokenStoreUnavailable) -> AdminError:
    log.debug("admin token store unavailable: %s", exc)  # the store reports its outage (sluice.outages)
    return unavailable("admin token store", "admin_token_store_unavailable")


class AdminController(Controller):
    path = "/admin/v1"
    tags = ["Admin"]  # noqa: RUF012 (Litestar reads these class attributes)
    guards = [require_admin]  # noqa: RUF012
    security = [{SECURITY_SCHEME: []}]  # noqa: RUF012

    @get("/whoami", opt=needs(Role.VIEWER), responses=error_responses(401, 503))
    async def whoami(self, request: Request[Any, Any, Any]) -> WhoAmI:
        """The caller's token name and role, and the roles its role covers."""
        principal = principal_of(request)
        covered = [role for role in ROLES_BY_RANK if role_allows(principal.role, role)]
        return WhoAmI(name=principal.name, role=principal.role, roles_covered=covered)

    @post("/tokens", opt=needs(Role.PLATFORM_ADMIN), responses=error_responses(400, 401, 403, 409, 503))
    async def create_token(
        self, request: Request[Any, Any, Any], data: JSONBody[CreateTokenBody]
    ) -> CreatedToken:
        """A new admin token; the response is the only time the token is ever shown."""
        try:
            token = await state_of(request).tokens.create(data.name, data.role)
        except AdminTokenExistsError as exc:
            raise AdminError(
                409, f"An active admin token is named {data.name!r} already.", code="admin_token_exists"
            ) from exc
        except ValueError as exc:
            raise AdminError(400, str(exc), param="name") from exc
        except AdminTokenStoreUnavailable as exc:
            raise _store_down(exc) from exc
        actor = principal_of(request)
        log.info("admin token %r (%s) created by %s (%s)", data.name, data.role, actor.name, actor.role)
        return CreatedToken(
            name=data.name,
            role=data.role,
            token=token,
            token_prefix=token_prefix(token),
            note=TOKEN_SHOWN_ONCE,
        )

    @get("/tokens", opt=needs(Role.PLATFORM_ADMIN), responses=error_responses(401, 403, 503))
    async def list_tokens(self, request: Request[Any, Any, Any]) -> list[TokenView]:
        """Every admin token, active and revoked, by name then creation time."""
        try:
            tokens = await state_of(request).tokens.list()
        except AdminTokenStoreUnavailable as exc:
            raise _store_down(exc) from exc
        return [token_view(t) for t in tokens]

    @delete(
        "/tokens/{name:str}",
        opt=needs(Role.PLATFORM_ADMIN),
        status_code=200,
        responses=error_responses(401, 403, 404, 503),
    )
    async def revoke_token(self, request: Request[Any, Any, Any], name: FromPath[str]) -> TokenView:
        """Revoke the active token with this name: it stops working at once. The token as revoked."""
        try:
            revoked = await state_of(request).tokens.revoke(name)
        except UnknownAdminTokenError as exc:
            raise AdminError(
                404, f"No active admin token is named {name!r}.", code="admin_token_not_found"
            ) from exc
        except AdminTokenStoreUnavailable as exc:
            raise _store_down(exc) from exc
        actor = principal_of(request)
        log.info("admin token %r (%s) revoked by %s (%s)", name, revoked.role, actor.name, actor.role)
        return token_view(revoked)
