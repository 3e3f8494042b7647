"""The client on the wire, against a stub server (tests/client/stub_gateway.py) that scripts exactly what
the gateway sends in the cases that are hard to provoke on a real one at will: the same Idempotency-Key on
every retry, retry-after-ms over Retry-After, 409 in progress, dropped connections, an error event
mid-stream, a connection lost mid-stream, and the hang-up on close and on task cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from stub_gateway import Drop, Reply, Sse, StubGateway, chat_chunk, chat_completion, error_body

from sluice_client import AsyncSluiceClient, SluiceAPIError, SluiceClient, SluiceConnectionError, StreamError

FAST: dict[str, Any] = {"backoff_initial_s": 0.01, "backoff_max_s": 0.05}  # no server advice: barely wait
MESSAGES = [{"role": "user", "content": "hi"}]
ENGINE_ERROR = error_body("engine_error", "The model replica failed: boom")


@pytest.fixture(scope="module")
def stub() -> Iterator[StubGateway]:
    server = StubGateway()
    yield server
    server.close()


@pytest.fixture
def client(stub: StubGateway) -> Iterator[SluiceClient]:
    with SluiceClient(stub.url + "/v1", "sk-test", max_retries=3, **FAST) as client:
        yield client


def keys(stub: StubGateway) -> list[str]:
    return [seen.headers["idempotency-key"] for seen in stub.seen]


def test_retry_after_ms_is_honoured_over_retry_after_with_the_same_key(
    stub: StubGateway, client: SluiceClient
) -> None:
    stub.script(
        Reply(503, error_body("service_overloaded"), {"retry-after-ms": "300", "Retry-After": "5"}),
        Reply(429, error_body("concurrent_requests_exceeded"), {"retry-after-ms": "100"}),
        Reply(409, error_body("idempotency_key_in_progress")),  # no advice: backoff
        Reply(200, chat_completion("done"), {"X-Request-Id": "req-4"}),
    )
    reply = client.chat.completions.create(model="m", messages=MESSAGES)
    assert (reply.text, reply.request_id) == ("done", "req-4")
    assert len(set(keys(stub))) == 1 and len(stub.seen) == 4 and reply.idempotency_key == keys(stub)[0]
    gaps_s = [b.at_s - a.at_s for a, b in zip(stub.seen, stub.seen[1:], strict=False)]
    assert 0.3 <= gaps_s[0] < 2.0 and 0.1 <= gaps_s[1] < 1.0 and gaps_s[2] < 0.5, gaps_s
    assert stub.seen[0].body == {"model": "m", "messages": MESSAGES, "stream": False}


def test_retry_after_in_seconds_when_there_is_no_ms(stub: StubGateway, client: SluiceClient) -> None:
    stub.script(
        Reply(503, error_body("tenant_store_unavailable"), {"Retry-After": "1"}),
        Reply(200, chat_completion("x")),
    )
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert 1.0 <= stub.seen[1].at_s - stub.seen[0].at_s < 2.0


def test_the_callers_key_is_kept_and_other_4xx_are_not_retried(
    stub: StubGateway, client: SluiceClient
) -> None:
    stub.script(Reply(422, error_body("idempotency_key_reused", "another body"), {"X-Request-Id": "req-9"}))
    with pytest.raises(SluiceAPIError) as refused:
        client.completions.create(model="m", prompt="x", idempotency_key="my-key-1")
    error = refused.value
    assert (error.status, error.code, error.message, error.request_id) == (
        422,
        "idempotency_key_reused",
        "another body",
        "req-9",
    )
    assert (error.idempotency_key, error.num_attempts, keys(stub)) == ("my-key-1", 1, ["my-key-1"])
    assert stub.seen[0].path == "/v1/completions"


def test_out_of_retries_raises_the_last_error(stub: StubGateway, client: SluiceClient) -> None:
    stub.script(*[Reply(500, error_body("engine_error"))] * 4)
    with pytest.raises(SluiceAPIError) as failed:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert (failed.value.status, failed.value.code, failed.value.num_attempts) == (500, "engine_error", 4)
    assert len(set(keys(stub))) == 1


def test_a_dropped_connection_is_retried_with_the_same_key(stub: StubGateway, client: SluiceClient) -> None:
    stub.script(Drop(), Reply(200, chat_completion("ok")))
    assert client.chat.completions.create(model="m", messages=MESSAGES).text == "ok"
    assert len(keys(stub)) == 2 and len(set(keys(stub))) == 1
    stub.script(*[Drop()] * 4)
    with pytest.raises(SluiceConnectionError) as lost:
        client.chat.completions.create(model="m", messages=MESSAGES)
    assert lost.value.num_attempts == 4 and lost.value.idempotency_key == keys(stub)[0]


def test_a_stream_that_fails_before_its_first_event_is_retried(
    stub: StubGateway, client: SluiceClient
) -> None:
    stub.script(Drop(), Sse([], end="close"), Sse([chat_chunk("a"), chat_chunk("b", "stop")]))
    with client.chat.completions.create(model="m", messages=MESSAGES, stream=True) as stream:
        assert [chunk.text for chunk in stream] == ["a", "b"]
    assert stream.text == "ab" and stream.request_id == "req-stub"
    assert len(keys(stub)) == 3 and len(set(keys(stub))) == 1
    assert stub.seen[0].headers["accept"] == "text/event-stream"


def test_an_error_event_mid_stream_raises_with_the_partial_text(
    stub: StubGateway, client: SluiceClient
) -> None:
    stub.script(Sse([chat_chunk("Hel"), chat_chunk("lo"), ENGINE_ERROR], end="close"))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    received = []
    with pytest.raises(StreamError) as failed:
        for chunk in stream:
            received.append(chunk.text)
    assert received == ["Hel", "lo"]
    error = failed.value
    assert (error.code, error.partial_text, error.request_id) == ("engine_error", "Hello", "req-stub")
    assert error.idempotency_key == keys(stub)[0] and len(stub.seen) == 1  # not retried by the client
    assert list(stream) == []  # a failed stream is over


def test_a_connection_lost_mid_stream_raises_with_the_partial_text(
    stub: StubGateway, client: SluiceClient
) -> None:
    stub.script(Sse([chat_chunk("par"), chat_chunk("tial")], end="close"))
    with pytest.raises(StreamError) as failed:
        list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert (failed.value.code, failed.value.partial_text) == ("connection_lost", "partial")


def test_closing_a_stream_hangs_up_at_once(stub: StubGateway, client: SluiceClient) -> None:
    stub.script(Sse([chat_chunk("one")], end="hang"))
    stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert next(stream).text == "one"
    stream.close()
    assert stub.hung_up.wait(5)


def test_async_retries_with_one_key_and_raises_mid_stream_errors(stub: StubGateway) -> None:
    async def run() -> None:
        async with AsyncSluiceClient(stub.url, "sk-test", max_retries=2, **FAST) as client:
            stub.script(Reply(429, error_body("tokens_per_minute_exceeded"), {"retry-after-ms": "200"}),
                        Reply(200, chat_completion("fine")))  # fmt: skip
            reply = await client.chat.completions.create(model="m", messages=MESSAGES)
            assert reply.text == "fine" and len(set(keys(stub))) == 1
            assert 0.2 <= stub.seen[1].at_s - stub.seen[0].at_s < 1.5

            stub.script(Drop(), Sse([chat_chunk("Hel"), chat_chunk("lo"), ENGINE_ERROR], end="close"))
            stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
            with pytest.raises(StreamError) as failed:
                async for _ in stream:
                    pass
            assert (failed.value.code, failed.value.partial_text) == ("engine_error", "Hello")
            assert len(keys(stub)) == 2 and len(set(keys(stub))) == 1

    asyncio.run(run())


def test_cancelling_the_reading_task_hangs_up(stub: StubGateway) -> None:
    async def read_all(client: AsyncSluiceClient, first: asyncio.Event | None) -> None:
        stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        async for _ in stream:
            if first is not None:
                first.set()

    async def run() -> None:
        async with AsyncSluiceClient(stub.url, "sk-test", **FAST) as client:
            for events in ([chat_chunk("one")], []):  # mid-stream, then while waiting for the first event
                stub.script(Sse(events, end="hang"))
                first = asyncio.Event() if events else None
                task = asyncio.create_task(read_all(client, first))
                if first is not None:
                    await first.wait()
                else:
                    assert await asyncio.to_thread(stub.arrived.wait, 5)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert await asyncio.to_thread(stub.hung_up.wait, 5), events

    asyncio.run(run())
