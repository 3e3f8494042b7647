"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the right HTTP status.

Handlers raise ``OpenAIError``; Litestar's own errors (validation, 404 route, 413 body, 405) are mapped
to the same shape, so a client never sees another error format.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_500_INTERNAL_SERVER_ERROR

from gateway.metrics import GatewayMetrics
from sluice.api_errors import ApiError

# Metric labels: known routes only, so random 404 paths cannot grow the label set (a path with an id in
# it, e.g. /v1/batches/{id}, counts as "other").
KNOWN_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/usage", "/v1/files", "/v1/batches"}
)


class OpenAIError(ApiError):
    def __init__(self, status_code: int, message: str, **kwargs: Any) -> None:
        super().__init__(status_code, message, **kwargs)
        # Set when the request's own ``finally`` already counted it in the metrics.
        self.counted = False
        # The request's id once it had one (admitted): sent as X-Request-Id, as on its successes, so a
        # client can name a failed request in its telemetry record and logs.
        self.request_id: str | None = None

    def headers(self) -> dict[str, str]:
        """``Retry-After`` and ``retry-after-ms``: the official OpenAI and Anthropic SDKs honour both, the
        latter first; ``X-Request-Id`` when the request had one."""
        headers = super().headers()
        if self.retry_after_s is not None:
            headers["retry-after-ms"] = str(max(1, math.ceil(self.retry_after_s * 1000)))
        if self.request_id is not None:
            headers["X-Request-Id"] = self.request_id
        return headers


def refused(
    status_code: int,
    code: str,
    message: str,
    retry_after_s: float | None,
    error_type: str = "rate_limit_error",
) -> OpenAIError:
    """A refusal before any engine work: a tenant over one of its limits, or a service that is full."""
    return OpenAIError(status_code, message, type=error_type, code=code, retry_after_s=retry_after_s)


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def out_of_range(param: str, got: float, bound: float, above: bool) -> OpenAIError:
    """A number past one of its bounds, coded and worded as OpenAI's API does
    (``integer_below_min_value``: "Invalid 'max_tokens': integer below minimum value. Expected a value >=
    1, but got -1 instead.")."""
    kind = "integer" if isinstance(got, int) else "decimal"
    side, relation = ("above maximum", "<=") if above else ("below minimum", ">=")
    return OpenAIError(
        400,
        f"Invalid '{param}': {kind} {side} value. Expected a value {relation} {bound}, but got {got} "
        "instead.",
        param=param,
        code=f"{kind}_{'above_max' if above else 'below_min'}_value",
    )


# msgspec's refusals of a decoded body (``msgspec.convert``'s ValidationError, its message before
# " - at `$..."`), in the order tried, to the codes OpenAI's API gives the same mistakes; anything else
# msgspec refuses (an enum value, a pattern) is ``invalid_value``.
_MISSING_FIELD = re.compile(r"Object missing required field `([^`]+)`")
_MSGSPEC_CODES = (
    (_MISSING_FIELD, "missing_required_parameter"),
    (re.compile(r"Expected `int` [<>]"), "integer_{side}_value"),
    (re.compile(r"Expected `float` [<>]"), "decimal_{side}_value"),
    (re.compile(r"Expected `str` of length [<>]"), "string_{side}_length"),
    (re.compile(r"Expected `(array|object)` of length [<>]"), "array_{side}_length"),
    (re.compile(r"Expected `[^`]+`, got `"), "invalid_type"),
)


def invalid_field(message: str, where: str) -> OpenAIError:
    """A 400 for a body msgspec refused: ``message`` is its ValidationError's text before " - at `$",
    ``where`` the path after it ("" for the body itself; "messages[0].role"). ``param`` names the field,
    ``code`` is OpenAI's for the mistake."""
    missing = _MISSING_FIELD.fullmatch(message)
    field = ".".join(part for part in (where, missing[1] if missing else "") if part) or None
    code = next((code for pattern, code in _MSGSPEC_CODES if pattern.match(message)), "invalid_value")
    code = code.format(side="above_max" if "<" in message else "below_min")
    shown = message[0].lower() + message[1:]
    if missing:
        text = f"Missing required parameter: '{field}'."
    else:
        text = f"Invalid '{field}': {shown}." if field else f"Invalid request body: {shown}."
    return invalid_request(text, param=field, code=code)


def invalid_api_key() -> OpenAIError:
    return OpenAIError(
        401,
        "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
        type="invalid_request_error",
        code="invalid_api_key",
    )


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


def context_length_exceeded(message: str, param: str = "messages") -> OpenAIError:
    return OpenAIError(400, message, code="context_length_exceeded", param=param)


def content_filtered(message: str) -> OpenAIError:
    """The terminal event of a stream the output filter stopped (after its content_filter chunk)."""
    return OpenAIError(400, f"The output was stopped: {message}.", code="content_filter")


def from_http_exception(exc: HTTPException) -> OpenAIError:
    status = exc.status_code
    if isinstance(exc, ValidationException) or status == 400:
        # msgspec's refusal of the body as Litestar carries it: the field as Litestar names it from
        # msgspec's path ("messages[0].role"), "data" for the body as a whole.
        errors = [e for e in (exc.extra or []) if isinstance(e, dict) and e.get("message")]
        if errors:
            key = str(errors[0].get("key") or "")
            return invalid_field(str(errors[0]["message"]), "" if key == "data" else key)
        return invalid_request(f"Invalid request: {exc.detail}")
    if status == 413:
        return OpenAIError(413, "Request body too large.", code="request_too_large")
    error_type = "invalid_request_error" if status < 500 else "server_error"
    return OpenAIError(status, str(exc.detail), type=error_type)


def invalid_url(status_code: int, method: str, path: str) -> OpenAIError:
    """A route this gateway does not serve (404), or not with this method (405), worded as OpenAI's API
    words it ("Invalid URL (POST /v1/embeddings)")."""
    shown = path if len(path) <= 200 else path[:200] + "..."
    if status_code == 405:
        return OpenAIError(405, f"Invalid method for URL ({method} {shown})", code="method_not_allowed")
    return OpenAIError(404, f"Invalid URL ({method} {shown})", code="not_found")


def error_response(err: OpenAIError) -> Response[dict[str, Any]]:
    return Response(err.body(), status_code=err.status_code, headers=err.headers())


def exception_handlers(metrics: GatewayMetrics) -> dict[Any, Any]:
    def on_openai(request: Request[Any, Any, Any], exc: OpenAIError) -> Response[dict[str, Any]]:
        if not exc.counted:
            path = request.url.path
            metrics.count_rejected(path if path in KNOWN_ROUTES else "other", exc.status_code)
        return error_response(exc)

    def on_http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[dict[str, Any]]:
        if exc.status_code in (404, 405):  # no such route, or not with this method: name what was asked
            return on_openai(request, invalid_url(exc.status_code, request.method, request.url.path))
        return on_openai(request, from_http_exception(exc))

    def on_other(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
        request.logger.exception("unhandled error")
        return on_openai(
            request,
            OpenAIError(HTTP_500_INTERNAL_SERVER_ERROR, "Internal server error.", type="server_error"),
        )

    return {OpenAIError: on_openai, HTTPException: on_http, Exception: on_other}


# ----- the error responses, as the OpenAPI schema declares them -----
class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(msgspec.Struct):
    error: ErrorDetail


_MEANINGS = {
    400: "Invalid request (`code`: null for a body that is not JSON, `invalid_type`, `invalid_value`, "
    "`missing_required_parameter`, `integer_below_min_value` and the other range codes OpenAI gives, "
    "`unsupported_parameter`, "
    "`unknown_parameter`, `context_length_exceeded`, `json_too_deep`, `content_filter`, "
    "`invalid_idempotency_key`, `request_exceeds_token_budget`); `param` names the field.",
    401: "`invalid_api_key`: no key, or one no tenant has.",
    403: "`service_tier_not_allowed`: this key may not use that class.",
    404: "`model_not_found`.",
    409: "`idempotency_key_in_progress`: an attempt with this key is running; retry after it ends.",
    413: "`request_too_large`: the body is over the gateway's limit.",
    422: "`idempotency_key_reused`: the key was used with another body.",
    429: "`tokens_per_minute_exceeded`, `concurrent_requests_exceeded` (this tenant's limits) or "
    "`service_overloaded` (the queue cannot start it before its deadline); with `Retry-After` and "
    "`retry-after-ms`.",
    503: "A dependency cannot answer now (`replica_unavailable`, `tenant_store_unavailable`, "
    "`quota_store_unavailable`, `idempotency_store_unavailable`, `safety_classifier_unavailable`, "
    "`usage_ledger_unavailable`) or the "
    "gateway is at its connection limit (`gateway_connection_limit`); with `Retry-After`.",
}


def error_responses(*status_codes: int) -> dict[int, ResponseSpec]:
    """The ``responses`` of a route handler: each status code with the error body and what it means."""
    return {
        code: ResponseSpec(data_container=ErrorBody, description=_MEANINGS[code], generate_examples=False)
        for code in status_codes
    }
