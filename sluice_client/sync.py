"""``SluiceClient``: the blocking client. Every attempt of a call carries the call's one Idempotency-Key;
failed attempts are retried per ``RetryPolicy``; a stream is returned once its first event arrived, so a
stream that fails before it is retried like any request, and one that fails after it raises
``StreamError`` with the partial text. Closing a stream closes its connection, which cancels the
generation on the gateway."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from typing import Any, Literal, overload

import httpx

from sluice_client.retry import RetryPolicy
from sluice_client.sse import Chunk, StreamReader
from sluice_client.wire import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    CallSpec,
    Completion,
    Failure,
    completion_call,
    completion_of,
    response_failure,
    root_url,
    transport_failure,
    usage_call,
)

log = logging.getLogger("sluice_client")


class Stream:
    """A streamed completion: iterate it for ``Chunk``s; ``text`` is the text so far. ``close()`` (or
    leaving a ``with`` block) closes the connection at once, which stops the generation. Raises
    ``StreamError`` (with ``partial_text``) if the stream fails after its first event."""

    def __init__(self, response: httpx.Response, pieces: Iterator[str], reader: StreamReader) -> None:
        self._response = response
        self._pieces = pieces
        self._reader = reader
        self.request_id = reader.request_id
        self.idempotency_key = reader.idempotency_key
        self._closed = False

    @property
    def text(self) -> str:
        return self._reader.text

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Chunk:
        if self._closed:  # ended, failed or closed by the caller: nothing more comes
            raise StopIteration
        try:
            while True:
                chunk = self._reader.next_chunk()
                if chunk is not None:
                    return chunk
                if self._reader.done:
                    break
                try:
                    piece = next(self._pieces)
                except StopIteration:
                    raise self._reader.lost(None) from None
                except httpx.TransportError as exc:
                    raise self._reader.lost(exc) from exc
                self._reader.feed(piece)
        except BaseException:
            self.close()
            raise
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Closes the connection (idempotent): the gateway sees the disconnect and cancels the request."""
        self._closed = True
        self._response.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SluiceClient:
    """A Sluice gateway's OpenAI API, with safe retries. ``base_url`` is the gateway's address (a trailing
    ``/v1`` is accepted, as the openai client takes it). See ``RetryPolicy`` for the retry arguments."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        max_retries: int = 4,
        timeout_s: float = 60.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 8.0,
        max_wait_s: float = 30.0,
    ) -> None:
        self.retry_policy = RetryPolicy(
            max_retries=max_retries,
            backoff_initial_s=backoff_initial_s,
            backoff_max_s=backoff_max_s,
            max_wait_s=max_wait_s,
        )
        self._http = httpx.Client(
            base_url=root_url(base_url),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
        )
        self.chat = _Chat(self)
        self.completions = _Completions(self, COMPLETIONS_PATH)

    def usage(
        self,
        *,
        since: str | int | None = None,
        until: str | int | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """GET /v1/usage: the caller's totals and per-request rows (one per attempt that reached a
        replica, each with its ``idempotency_key`` and ``attempt``)."""
        spec = usage_call(since=since, until=until, model=model, idempotency_key=idempotency_key, limit=limit)
        completion = self._call(spec)
        assert isinstance(completion, Completion)
        return completion.body

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SluiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, spec: CallSpec) -> Completion | Stream:
        """Attempts until one succeeds, a failure is not retryable, or the retries are spent."""
        retry = 0
        while True:
            result = self._attempt(spec)
            if not isinstance(result, Failure):
                return result
            if not result.retryable or self.retry_policy.gives_up(retry):
                raise result.final_error(spec.idempotency_key, retry + 1)
            wait_s = self.retry_policy.wait_s(retry, result.headers, time.time(), random.random())
            log.info(
                "retrying %s %s in %.3f s after %s (retry %d of %d, Idempotency-Key %s)",
                spec.method, spec.path, wait_s, result.describe(), retry + 1,
                self.retry_policy.max_retries, spec.idempotency_key,
                extra={"retry_wait_s": wait_s, "idempotency_key": spec.idempotency_key},
            )  # fmt: skip
            time.sleep(wait_s)
            retry += 1

    def _attempt(self, spec: CallSpec) -> Completion | Stream | Failure:
        request = self._http.build_request(
            spec.method, spec.path, json=spec.body, params=spec.params, headers=spec.headers
        )
        try:
            response = self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            return transport_failure(exc)
        if spec.stream and response.status_code < 400:
            return self._first_event(response, spec)
        try:
            content = response.read()
        except httpx.TransportError as exc:
            return transport_failure(exc)
        finally:
            response.close()
        if response.status_code >= 400:
            return response_failure(response.status_code, response.headers, content)
        return completion_of(content, response.headers, spec.idempotency_key)

    def _first_event(self, response: httpx.Response, spec: CallSpec) -> Stream | Failure:
        """Reads until the stream's first event: a stream that fails before it is retried as a request."""
        reader = StreamReader(response.headers.get("x-request-id"), spec.idempotency_key)
        pieces = response.iter_text()
        try:
            while not reader.has_event():
                reader.feed(next(pieces))
        except StopIteration:
            response.close()
            return transport_failure(ConnectionError("the stream closed before its first event"))
        except httpx.TransportError as exc:
            response.close()
            return transport_failure(exc)
        except BaseException:
            response.close()
            raise
        return Stream(response, pieces, reader)


class _Completions:
    """``create`` for one completion endpoint (chat or text): ``params`` are the JSON body."""

    def __init__(self, client: SluiceClient, path: str) -> None:
        self._client = client
        self._path = path

    @overload
    def create(
        self,
        *,
        stream: Literal[True],
        idempotency_key: str | None = ...,
        extra_headers: dict[str, str] | None = ...,
        **params: Any,
    ) -> Stream: ...
    @overload
    def create(
        self,
        *,
        stream: Literal[False] = ...,
        idempotency_key: str | None = ...,
        extra_headers: dict[str, str] | None = ...,
        **params: Any,
    ) -> Completion: ...
    def create(
        self,
        *,
        stream: bool = False,
        idempotency_key: str | None = None,
        extra_headers: dict[str, str] | None = None,
        **params: Any,
    ) -> Completion | Stream:
        """POST the endpoint with ``params`` (``model``, ``messages`` or ``prompt``, ``max_tokens``...) as
        the body, under ``idempotency_key`` (default: a new uuid4 for this call) on every attempt."""
        body = {**params, "stream": stream}
        return self._client._call(completion_call(self._path, body, idempotency_key, extra_headers))


class _Chat:
    def __init__(self, client: SluiceClient) -> None:
        self.completions = _Completions(client, CHAT_PATH)
