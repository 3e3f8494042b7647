"""The client's pure parts: which failures it retries and how long it waits (``sluice_client.retry``), and
how it reads server-sent events (``sluice_client.sse``)."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from sluice_client.errors import StreamError
from sluice_client.retry import RetryPolicy, is_retryable, retry_after_s
from sluice_client.sse import CONNECTION_LOST, Chunk, ErrorEvent, SseDecoder, StreamReader, read_event
from sluice_client.wire import completion_call, root_url

NOW_S = 1_800_000_000.0


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_rate_limits_and_server_errors_are_retried(status: int) -> None:
    assert is_retryable(status, None)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422, 501])
def test_other_errors_are_not(status: int) -> None:
    assert not is_retryable(status, "anything")


def test_409_is_retried_only_while_the_key_is_in_progress() -> None:
    assert is_retryable(409, "idempotency_key_in_progress")
    assert not is_retryable(409, "conflict")
    assert not is_retryable(422, "idempotency_key_reused")


def test_retry_after_ms_wins_over_retry_after() -> None:
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "3"}, NOW_S) == 0.25
    assert retry_after_s({"retry-after": "3"}, NOW_S) == 3.0
    assert retry_after_s({"retry-after": "1.5"}, NOW_S) == 1.5


def test_retry_after_as_an_http_date() -> None:
    in_7_s = format_datetime(datetime.fromtimestamp(NOW_S + 7, UTC), usegmt=True)
    assert retry_after_s({"retry-after": in_7_s}, NOW_S) == pytest.approx(7.0)
    past = format_datetime(datetime.fromtimestamp(NOW_S - 60, UTC), usegmt=True)
    assert retry_after_s({"retry-after": past}, NOW_S) == 0.0


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", ""])
def test_unreadable_advice_is_no_advice(value: str) -> None:
    assert retry_after_s({"retry-after": value}, NOW_S) is None
    assert retry_after_s({"retry-after-ms": value}, NOW_S) is None


def test_backoff_doubles_up_to_its_cap_with_jitter_below() -> None:
    policy = RetryPolicy(backoff_initial_s=0.5, backoff_max_s=4.0, jitter=0.25)
    assert [policy.backoff_s(retry, 0.0) for retry in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert policy.backoff_s(1, 0.999) == pytest.approx(1.0 * (1 - 0.25 * 0.999))
    assert policy.backoff_s(10_000, 0.0) == 4.0  # no overflow however many retries


def test_wait_takes_the_servers_advice_capped() -> None:
    policy = RetryPolicy(max_wait_s=10.0)
    assert policy.wait_s(0, {"retry-after-ms": "1200"}, NOW_S, 0.5) == 1.2
    assert policy.wait_s(0, {"retry-after": "3600"}, NOW_S, 0.5) == 10.0
    assert policy.wait_s(2, {}, NOW_S, 0.0) == 2.0  # no advice: backoff
    assert policy.wait_s(2, None, NOW_S, 0.0) == 2.0  # no response at all: backoff


def test_attempts_are_bounded() -> None:
    policy = RetryPolicy(max_retries=2)
    assert [policy.gives_up(retry) for retry in range(4)] == [False, False, True, True]
    with pytest.raises(ValueError):
        RetryPolicy(max_retries=-1)
    with pytest.raises(ValueError):
        RetryPolicy(backoff_initial_s=2.0, backoff_max_s=1.0)


def test_sse_events_split_anywhere_and_any_line_ending() -> None:
    wire = (
        'data: {"a": 1}\r\n\r\n: keep-alive\n\ndata: line one\ndata: line two\n\nevent: x\rdata: [DONE]\r\r'
    )
    for size in (1, 2, 3, 7, len(wire)):
        decoder = SseDecoder()
        events = [e for start in range(0, len(wire), size) for e in decoder.feed(wire[start : start + size])]
        assert events == ['{"a": 1}', "line one\nline two", "[DONE]"], size


def test_an_event_cut_off_by_the_end_of_the_stream_is_dropped() -> None:
    decoder = SseDecoder()
    assert decoder.feed('data: {"a": 1}\n\ndata: {"b"') == ['{"a": 1}']


def test_reading_events() -> None:
    chat = read_event('{"choices": [{"delta": {"content": "hi"}, "finish_reason": null}]}')
    assert isinstance(chat, Chunk) and (chat.text, chat.finish_reason) == ("hi", None)
    text = read_event('{"choices": [{"text": "yo", "finish_reason": "length"}]}')
    assert isinstance(text, Chunk) and (text.text, text.finish_reason) == ("yo", "length")
    usage = read_event('{"choices": [], "usage": {"completion_tokens": 3}}')
    assert isinstance(usage, Chunk) and usage.text == "" and usage.usage == {"completion_tokens": 3}
    assert read_event("[DONE]") is None
    died = {"error": {"message": "replica died", "code": "engine_error", "type": "server_error"}}
    error = read_event(json.dumps(died))
    assert error == ErrorEvent("replica died", "engine_error", "server_error")
    garbage = read_event("<html>")
    assert isinstance(garbage, ErrorEvent) and garbage.code == "invalid_event"


def _chunk(text: str) -> str:
    return f"data: {json.dumps({'choices': [{'delta': {'content': text}}]})}\n\n"


def test_a_stream_reader_keeps_the_text_and_raises_an_error_event_with_it() -> None:
    reader = StreamReader("req-1", "key-1")
    error = json.dumps({"error": {"message": "boom", "code": "engine_error"}})
    reader.feed(_chunk("Hel") + _chunk("lo") + f"data: {error}\n\n")
    assert [reader.next_chunk().text, reader.next_chunk().text] == ["Hel", "lo"]  # type: ignore[union-attr]
    with pytest.raises(StreamError) as failed:
        reader.next_chunk()
    assert (failed.value.code, failed.value.partial_text) == ("engine_error", "Hello")
    assert (failed.value.request_id, failed.value.idempotency_key) == ("req-1", "key-1")


def test_a_stream_reader_ends_at_done_and_names_a_lost_connection() -> None:
    reader = StreamReader(None, "k")
    reader.feed(_chunk("a") + "data: [DONE]\n\n" + _chunk("ignored"))
    assert reader.next_chunk() is not None and reader.next_chunk() is None and reader.done
    lost = StreamReader(None, "k")
    lost.feed(_chunk("ab"))
    assert lost.next_chunk() is not None and lost.next_chunk() is None and not lost.done
    error = lost.lost(ConnectionResetError("reset"))
    assert (error.code, error.partial_text) == (CONNECTION_LOST, "ab") and "reset" in str(error)


def test_the_client_loads_no_server_code() -> None:
    """sluice_client is the part of the core a caller imports: httpx, never the gateway's stack."""
    probe = (
        "import sys, sluice_client; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'gateway', 'control_plane', "
        "'cpu_engine', 'litestar', 'numpy', 'psycopg', 'redis', 'tritonclient'}))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def test_one_key_per_call_the_callers_when_given() -> None:
    first = completion_call("/v1/completions", {"prompt": "x"}, None, None)
    second = completion_call("/v1/completions", {"prompt": "x"}, None, None)
    assert first.idempotency_key and first.idempotency_key != second.idempotency_key
    assert first.headers == {"Idempotency-Key": first.idempotency_key}
    given = completion_call("/v1/completions", {}, None, {"idempotency-key": "k-1", "X-Conversation-Id": "c"})
    assert given.headers == {"Idempotency-Key": "k-1", "X-Conversation-Id": "c"}
    argument_wins = completion_call("/v1/completions", {}, "k-2", {"Idempotency-Key": "k-1"})
    assert argument_wins.headers == {"Idempotency-Key": "k-2"} and argument_wins.idempotency_key == "k-2"
    streamed = completion_call("/v1/chat/completions", {"stream": True}, None, None)
    assert streamed.stream and streamed.headers["Accept"] == "text/event-stream"


def test_the_base_url_may_end_in_v1() -> None:
    assert root_url("http://h:8080/v1/") == root_url("http://h:8080") == "http://h:8080"
