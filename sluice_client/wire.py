"""What the sync and async clients build and read the same way: the request (path, JSON body, headers with
the Idempotency-Key), a finished response (``Completion``), and an error response (``SluiceAPIError``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice_client.errors import SluiceAPIError, SluiceConnectionError, SluiceError
from sluice_client.retry import is_retryable

IDEMPOTENCY_HEADER = "Idempotency-Key"
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
USAGE_PATH = "/v1/usage"


def root_url(base_url: str) -> str:
    """The gateway's root: ``http://host:8080`` from that or from ``http://host:8080/v1`` (openai's form)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass(frozen=True)
class CallSpec:
    """One logical call: sent unchanged (same key, same body) on every attempt."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    params: dict[str, str] | None
    idempotency_key: str | None
    stream: bool


def completion_call(
    path: str,
    body: dict[str, Any],
    idempotency_key: str | None,
    extra_headers: Mapping[str, str] | None,
) -> CallSpec:
    """A POST to a completion endpoint; the key is the caller's (``idempotency_key``, or an
    Idempotency-Key in ``extra_headers``, as the openai client takes it), else a new uuid4 for this call."""
    headers = {}
    for name, value in (extra_headers or {}).items():
        if name.lower() == IDEMPOTENCY_HEADER.lower():
            idempotency_key = idempotency_key if idempotency_key is not None else value
        else:
            headers[name] = value
    key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
    headers[IDEMPOTENCY_HEADER] = key
    stream = bool(body.get("stream"))
    if stream:
        headers["Accept"] = "text/event-stream"
    return CallSpec("POST", path, headers, body, None, key, stream)


def usage_call(**filters: str | int | None) -> CallSpec:
    """GET /v1/usage with the filters given (None: not sent). A GET changes nothing, so it has no key."""
    params = {name: str(value) for name, value in filters.items() if value is not None}
    return CallSpec("GET", USAGE_PATH, {}, None, params, None, False)


@dataclass(frozen=True)
class Completion:
    """A non-streamed completion: the decoded ``body`` (the OpenAI response object), its first choice's
    ``text``, and what the gateway's headers say (``request_id``, ``model_version``), with the
    ``idempotency_key`` it was sent under."""

    body: dict[str, Any]
    text: str
    request_id: str | None
    model_version: str | None
    idempotency_key: str | None

    @property
    def usage(self) -> dict[str, Any] | None:
        usage = self.body.get("usage")
        return usage if isinstance(usage, dict) else None


def completion_of(content: bytes, headers: Mapping[str, str], key: str | None) -> Completion:
    """A 2xx response's body, read; ``SluiceAPIError`` (code ``invalid_response``) if not a JSON object."""
    try:
        body = json.loads(content)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise SluiceAPIError(
            200,
            f"expected a JSON object, got {content[:200].decode('utf-8', 'replace')!r}",
            code="invalid_response",
            request_id=headers.get("x-request-id"),
            idempotency_key=key,
        )
    choices = body.get("choices") or []
    first = choices[0] if choices and isinstance(choices[0], dict) else {}
    message = first.get("message")
    text = message.get("content") if isinstance(message, dict) else first.get("text")
    return Completion(
        body=body,
        text=text if isinstance(text, str) else "",
        request_id=headers.get("x-request-id"),
        model_version=headers.get("sluice-model-version"),
        idempotency_key=key,
    )


def error_code(content: bytes) -> str | None:
    """The OpenAI error body's ``code``, or None (not JSON, or another shape)."""
    error = _error_body(content)
    code = error.get("code")
    return code if isinstance(code, str) else None


def api_error(
    status: int, headers: Mapping[str, str], content: bytes, key: str | None, num_attempts: int
) -> SluiceAPIError:
    """The typed error for an error response; a body that is not the OpenAI shape (a proxy's HTML page)
    keeps its first 200 characters as the message."""
    error = _error_body(content)
    message = error.get("message")
    if not isinstance(message, str):
        message = content[:200].decode("utf-8", "replace") or f"HTTP {status}"

    def field(name: str) -> str | None:
        value = error.get(name)
        return value if isinstance(value, str) else None

    return SluiceAPIError(
        status,
        message,
        code=field("code"),
        type=field("type"),
        param=field("param"),
        request_id=headers.get("x-request-id"),
        idempotency_key=key,
        num_attempts=num_attempts,
    )


def _error_body(content: bytes) -> dict[str, Any]:
    try:
        body = json.loads(content)
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}


@dataclass(frozen=True)
class Failure:
    """One failed attempt: an error response (``status``, ``headers``, ``content``) or no response at all
    (``transport_error``). ``retryable`` per ``sluice_client.retry.is_retryable``; connection errors
    always are."""

    status: int | None
    headers: Mapping[str, str] | None
    content: bytes
    transport_error: BaseException | None

    @property
    def retryable(self) -> bool:
        return self.status is None or is_retryable(self.status, error_code(self.content))

    def describe(self) -> str:
        if self.status is None:
            return f"{type(self.transport_error).__name__}: {self.transport_error}"
        return f"HTTP {self.status} {error_code(self.content) or ''}".rstrip()

    def final_error(self, key: str | None, num_attempts: int) -> SluiceError:
        """What the caller gets once this failure is not retried."""
        if self.status is None:
            return SluiceConnectionError(
                f"no response after {num_attempts} attempt(s): {self.describe()}",
                idempotency_key=key,
                num_attempts=num_attempts,
            )
        return api_error(self.status, self.headers or {}, self.content, key, num_attempts)


def transport_failure(exc: BaseException) -> Failure:
    return Failure(None, None, b"", exc)


def response_failure(status: int, headers: Mapping[str, str], content: bytes) -> Failure:
    return Failure(status, headers, content, None)
