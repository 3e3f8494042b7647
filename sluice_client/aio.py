"""``AsyncSluiceClient``: the asyncio twin of ``sluice_client.sync.SluiceClient``, same retry policy, same
stream parsing. Cancelling the task that reads a stream (or ``aclose()``, or leaving ``async with``)
closes its connection at once, which cancels the generation on the gateway."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator
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


class AsyncStream:
    """A streamed completion: ``async for`` it for ``Chunk``s; ``text`` is the text so far. ``aclose()``,
    leaving ``async with``, or cancelling the reading task closes the connection, stopping the generation.
    Raises ``StreamError`` (with ``partial_text``) if the stream fails after its first event."""

    def __init__(self, response: httpx.Response, pieces: AsyncIterator[str], reader: StreamReader) -> None:
        self._response = response
        self._pieces = pieces
        self._reader = reader
        self.request_id = reader.request_id
        self.idempotency_key = reader.idempotency_key
        self._closed = False

    @property
    def text(self) -> str:
        return self._reader.text

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Chunk:
        if self._closed:  # ended, failed or closed by the caller: nothing more comes
            raise StopAsyncIteration
        try:
            while True:
                chunk = self._reader.next_chunk()
                if chunk is not None:
                    return chunk
                if self._reader.done:
                    break
                try:
                    piece = await anext(self._pieces)
                except StopAsyncIteration:
                    raise self._reader.lost(None) from None
                except httpx.TransportError as exc:
                    raise self._reader.lost(exc) from exc
                self._reader.feed(piece)
        except BaseException:  # CancelledError included: the connection must not outlive the reader
            await self.aclose()
            raise
        await self.aclose()
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Closes the connection (idempotent): the gateway sees the disconnect and cancels the request."""
        self._closed = True
        await self._response.aclose()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSluiceClient:
    """A Sluice gateway's OpenAI API, with safe retries, for asyncio. Arguments as ``SluiceClient``'s."""

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
        self._http = httpx.AsyncClient(
            base_url=root_url(base_url),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
        )
        self.chat = _Chat(self)
        self.completions = _Completions(self, COMPLETIONS_PATH)

    async def usage(
        self,
        *,
        since: str | int | None = None,
        until: str | int | None = None,
        model: str | None = None,
        idempotency_key: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """GET /v1/usage, as ``SluiceClient.usage``."""
        spec = usage_call(since=since, until=until, model=model, idempotency_key=idempotency_key, limit=limit)
        completion = await self._call(spec)
        assert isinstance(completion, Completion)
        return completion.body

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncSluiceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _call(self, spec: CallSpec) -> Completion | AsyncStream:
        """Attempts until one succeeds, a failure is not retryable, or the retries are spent."""
        retry = 0
        while True:
            result = await self._attempt(spec)
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
            await asyncio.sleep(wait_s)
            retry += 1

    async def _attempt(self, spec: CallSpec) -> Completion | AsyncStream | Failure:
        request = self._http.build_request(
            spec.method, spec.path, json=spec.body, params=spec.params, headers=spec.headers
        )
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            return transport_failure(exc)
        if spec.stream and response.status_code < 400:
            return await self._first_event(response, spec)
        try:
            content = await response.aread()
        except httpx.TransportError as exc:
            return transport_failure(exc)
        finally:
            await response.aclose()
        if response.status_code >= 400:
            return response_failure(response.status_code, response.headers, content)
        return completion_of(content, response.headers, spec.idempotency_key)

    async def _first_event(self, response: httpx.Response, spec: CallSpec) -> AsyncStream | Failure:
        """Reads until the stream's first event: a stream that fails before it is retried as a request."""
        reader = StreamReader(response.headers.get("x-request-id"), spec.idempotency_key)
        pieces = response.aiter_text()
        try:
            while not reader.has_event():
                reader.feed(await anext(pieces))
        except StopAsyncIteration:
            await response.aclose()
            return transport_failure(ConnectionError("the stream closed before its first event"))
        except httpx.TransportError as exc:
            await response.aclose()
            return transport_failure(exc)
        except BaseException:  # cancelled while waiting for the first token: hang up
            await response.aclose()
            raise
        return AsyncStream(response, pieces, reader)


class _Completions:
    """``create`` for one completion endpoint (chat or text): ``params`` are the JSON body."""

    def __init__(self, client: AsyncSluiceClient, path: str) -> None:
        self._client = client
        self._path = path

    @overload
    async def create(
        self,
        *,
        stream: Literal[True],
        idempotency_key: str | None = ...,
        extra_headers: dict[str, str] | None = ...,
        **params: Any,
    ) -> AsyncStream: ...
    @overload
    async def create(
        self,
        *,
        stream: Literal[False] = ...,
        idempotency_key: str | None = ...,
        extra_headers: dict[str, str] | None = ...,
        **params: Any,
    ) -> Completion: ...
    async def create(
        self,
        *,
        stream: bool = False,
        idempotency_key: str | None = None,
        extra_headers: dict[str, str] | None = None,
        **params: Any,
    ) -> Completion | AsyncStream:
        """As ``SluiceClient``'s ``create``, awaited; a stream is an async iterator."""
        body = {**params, "stream": stream}
        return await self._client._call(completion_call(self._path, body, idempotency_key, extra_headers))


class _Chat:
    def __init__(self, client: AsyncSluiceClient) -> None:
        self.completions = _Completions(client, CHAT_PATH)
