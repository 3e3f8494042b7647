"""The admin API's errors, in the gateway's OpenAI shape: ``{"error": {"message", "type", "param",
"code"}}`` with the right HTTP status. Handlers and the guard raise ``AdminError``; Litestar's own errors
(validation, unknown route, wrong method) are mapped to the same shape, so a caller never sees another.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import ResponseSpec

from control_plane.service.metrics import UNMATCHED_ROUTE, ControlPlaneMetrics
from sluice.api_errors import ApiError
from sluice.stores.admin_tokens.base import TOKEN_PREFIX
from sluice.stores.admin_tokens.roles import Role

log = logging.getLogger("sluice.control_plane")


class AdminError(ApiError):
    def headers(self) -> dict[str, str]:
        """``Retry-After`` when set; a 401 says which scheme to use (RFC 6750)."""
        headers = super().headers()
        if self.status_code == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="sluice-admin"'
        return headers


def invalid_admin_token(sent: str) -> AdminError:
    """401 for no token, an unknown or revoked one, and anything that is not an admin token. The hint
    reads only the format of what was sent: no store but the admin tokens' is ever asked."""
    if not sent:
        hint = f"No admin token: send 'Authorization: Bearer {TOKEN_PREFIX}...'."
    elif not sent.startswith(TOKEN_PREFIX):
        hint = f"Not an admin token: the admin API takes admin tokens ({TOKEN_PREFIX}...), never API keys."
    else:
        hint = "Unknown or revoked admin token."
    return AdminError(401, hint, code="invalid_admin_token")


def insufficient_role(name: str, held: Role, needed: Role) -> AdminError:
    return AdminError(
        403,
        f"This needs role {needed} or above; the token {name!r} has {held}.",
        type="permission_error",
        code="insufficient_role",
    )


def unavailable(what: str, code: str) -> AdminError:
    return AdminError(
        503, f"The {what} is unavailable. Retry later.", type="server_error", code=code, retry_after_s=2.0
    )


def from_http_exception(exc: HTTPException, path: str) -> AdminError:
    status = exc.status_code
    if isinstance(exc, ValidationException) or status == 400:
        errors = [e for e in (exc.extra or []) if isinstance(e, dict)]
        details = "; ".join(f"{e.get('key') or 'body'}: {e.get('message')}" for e in errors)
        keys = [str(e["key"]) for e in errors if e.get("key") and e.get("key") != "data"]
        message = f"Invalid request: {details}" if details else f"Invalid request: {exc.detail}"
        return AdminError(400, message, param=keys[0] if keys else None)
    if status == 404:
        return AdminError(404, f"No route {path}: see /schema/openapi.json.", code="not_found")
    if status == 405:
        return AdminError(405, str(exc.detail), code="method_not_allowed")
    if status == 413:
        return AdminError(413, "Request body too large.", code="request_too_large")
    return AdminError(
        status, str(exc.detail), type="invalid_request_error" if status < 500 else "server_error"
    )


def error_response(err: AdminError) -> Response[dict[str, Any]]:
    return Response(err.body(), status_code=err.status_code, headers=err.headers())


def exception_handlers(metrics: ControlPlaneMetrics) -> dict[Any, Any]:
    """Every error as ``AdminError``'s body. A request no route matched ends here without passing the
    metrics middleware (it runs only for matched routes): it is counted here, as route ``unmatched``."""

    def on_admin(request: Request[Any, Any, Any], exc: AdminError) -> Response[dict[str, Any]]:
        if "path_template" not in request.scope:
            metrics.count_request(UNMATCHED_ROUTE, request.method, exc.status_code)
        return error_response(exc)

    def on_http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
        return on_admin(request, from_http_exception(exc, request.url.path))

    def on_other(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
        log.exception("unhandled error in %s %s", request.method, request.url.path)
        return on_admin(request, AdminError(500, "Internal server error.", type="server_error"))

    return {AdminError: on_admin, HTTPException: on_http, Exception: on_other}


# ----- the error responses, as the OpenAPI schema declares them -----
class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


_MEANINGS = {
    400: "Invalid request body or parameter; `param` names the field.",
    401: "`invalid_admin_token`: no admin token, an unknown or revoked one, or a tenant API key.",
    403: "`insufficient_role`: the token's role ranks below the one this operation needs.",
    404: "`admin_token_not_found` or `not_found`.",
    409: "`admin_token_exists`: an active token already has this name.",
    503: "`admin_token_store_unavailable` or `registry_unavailable`; with `Retry-After`.",
}


def error_responses(*status_codes: int) -> dict[int, ResponseSpec]:
    """The ``responses`` of a route handler: each status code with the error body and what it means."""
    return {
        code: ResponseSpec(data_container=ErrorBody, description=_MEANINGS[code], generate_examples=False)
        for code in status_codes
    }
