"""The client's exceptions: what the caller catches, each carrying what it needs to act (retry with the
same key, show the partial text, quote the request id to support)."""

from __future__ import annotations


class SluiceError(Exception):
    """Anything the client raises on purpose."""


class SluiceAPIError(SluiceError):
    """The gateway answered with an error: one it is pointless to retry (a 4xx other than 429 and 409
    ``idempotency_key_in_progress``), or a retryable one after the client ran out of retries. Fields are
    the OpenAI error body's, plus the HTTP ``status`` and the gateway's ``X-Request-Id`` when it sent one."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        type: str | None = None,
        param: str | None = None,
        request_id: str | None = None,
        idempotency_key: str | None = None,
        num_attempts: int = 1,
    ) -> None:
        super().__init__(f"{status} {code or type or 'error'}: {message}")
        self.status = status
        self.message = message
        self.code = code
        self.type = type
        self.param = param
        self.request_id = request_id
        self.idempotency_key = idempotency_key
        self.num_attempts = num_attempts


class SluiceConnectionError(SluiceError):
    """No response at all (refused, reset, timed out) on every attempt. Retrying later with the same
    ``idempotency_key`` is safe: a request that did run is replayed, not run again."""

    def __init__(self, message: str, *, idempotency_key: str | None, num_attempts: int) -> None:
        super().__init__(message)
        self.idempotency_key = idempotency_key
        self.num_attempts = num_attempts


class StreamError(SluiceError):
    """A stream that failed after its first event: the gateway's error event (``code`` its code, e.g.
    ``engine_error``, ``content_filter``), or the connection lost mid-stream (``code``
    ``connection_lost``). ``partial_text`` is the text received before it. Not retried by the client: a
    retry with the same ``idempotency_key`` starts the generation over (the gateway does not resume a
    stream), and is billed as a new attempt."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None,
        partial_text: str,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        super().__init__(f"{code or 'stream_error'}: {message} (after {len(partial_text)} characters)")
        self.message = message
        self.code = code
        self.partial_text = partial_text
        self.request_id = request_id
        self.idempotency_key = idempotency_key
