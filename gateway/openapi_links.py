"""OpenAPI links between the gateway's operations: what a client (or a stateful fuzzer) can do next with
a response.

- A completion can be retried with the same ``Idempotency-Key`` and body: the finished result is
  replayed, never generated or billed again.
- Its usage shows up in ``GET /v1/usage`` filtered by the response's ``model``.

Added to the schema Litestar generates (``add_links(app.openapi_schema)``); operations are found by
path and method, so renaming a handler does not silently drop a link.
"""

from __future__ import annotations

from litestar.openapi.spec import Link, OpenAPI, Operation

_COMPLETION_PATHS = ("/v1/chat/completions", "/v1/completions")
_USAGE_PATH = "/v1/usage"


def add_links(schema: OpenAPI) -> None:
    """Add the links above to ``schema`` in place. Raises ``LookupError`` if an operation is missing."""
    usage = _operation(schema, _USAGE_PATH, "get")
    for path in _COMPLETION_PATHS:
        operation = _operation(schema, path, "post")
        ok = (operation.responses or {}).get("200")
        if ok is None or not hasattr(ok, "links"):
            raise LookupError(f"POST {path} has no 200 response in the schema")
        ok.links = {
            "RetryWithSameIdempotencyKey": Link(
                operation_id=operation.operation_id,
                parameters={"header.Idempotency-Key": "$request.header.Idempotency-Key"},
                request_body="$request.body",
                description="The same request and key again: the finished result is replayed, not billed.",
            ),
            "UsageOfThisModel": Link(
                operation_id=usage.operation_id,
                parameters={"query.model": "$response.body#/model"},
                description="What this tenant used of the model that answered.",
            ),
        }


def _operation(schema: OpenAPI, path: str, method: str) -> Operation:
    item = (schema.paths or {}).get(path)
    operation = getattr(item, method, None) if item is not None else None
    if not isinstance(operation, Operation) or operation.operation_id is None:
        raise LookupError(f"{method.upper()} {path} is not in the OpenAPI schema")
    return operation
