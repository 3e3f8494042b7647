"""The OpenAPI schema says what a client can get back: every error status an operation can answer with
(the OpenAI error body), and the links from a completion to its retry and to its usage."""

from __future__ import annotations

from typing import Any

import pytest
from harness import RunningGateway


@pytest.fixture(scope="module")
def schema(inprocess_gateway: RunningGateway) -> dict[str, Any]:
    with inprocess_gateway.http() as http:
        resp = http.get("/schema/openapi.json")
    resp.raise_for_status()
    body: dict[str, Any] = resp.json()
    return body


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_completions_declare_their_errors_and_links(schema: dict[str, Any], path: str) -> None:
    responses = schema["paths"][path]["post"]["responses"]
    for status in ("400", "401", "403", "404", "409", "413", "422", "429", "503"):
        content = responses[status]["content"]["application/json"]["schema"]
        assert content == {"$ref": "#/components/schemas/ErrorBody"}, status
    assert "tenant_store_unavailable" in responses["503"]["description"]
    links = responses["200"]["links"]
    assert links["RetryWithSameIdempotencyKey"]["parameters"] == {
        "header.Idempotency-Key": "$request.header.Idempotency-Key"
    }
    usage_op = schema["paths"]["/v1/usage"]["get"]["operationId"]
    assert links["UsageOfThisModel"]["operationId"] == usage_op


def test_the_error_body_is_openais(schema: dict[str, Any]) -> None:
    detail_ref = schema["components"]["schemas"]["ErrorBody"]["properties"]["error"]["$ref"]
    detail = schema["components"]["schemas"][detail_ref.rsplit("/", 1)[1]]
    assert set(detail["properties"]) == {"message", "type", "param", "code"}
