"""Clients that hold a connection without doing their part: one that stops reading a stream is cut off
after ``client_write_timeout_s`` (its request cancelled, metered, its replica slot freed and the engine
call cancelled) while other tenants stream on; one that never finishes its request head is closed after
``client_header_timeout_s``; a request head over ``max_request_head_bytes`` is refused.

The engine is the scripted fake: every token is text, so every token is a chunk on the wire and the
bounded buffers fill after a known number of tokens (the dev model, told to ignore EOS, emits long runs
of tokens with no text, which would make the amount of output before back-pressure a matter of luck)."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, GLOBEX_KEY, MODEL, RunningGateway, start_gateway

from sluice.text import TextCodec

WRITE_TIMEOUT_S = 1.0
LONG_MAX_TOKENS = 2000  # ~300 KB of SSE: far more than the bounded buffers below hold


@pytest.fixture
def engine(dev_checkpoint: Path) -> ScriptedFakeEngine:
    return ScriptedFakeEngine(TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0], interval_s=0.001)


@pytest.fixture
def gateway(dev_checkpoint: Path, tmp_path: Path, engine: ScriptedFakeEngine) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=engine,
        max_output_tokens=LONG_MAX_TOKENS,
        client_write_timeout_s=WRITE_TIMEOUT_S,
        client_send_buffer_bytes=4096,
        client_header_timeout_s=1.0,
        max_request_head_bytes=8192,
    )
    yield gateway
    gateway.stop()


def _connect(gateway: RunningGateway, rcvbuf_bytes: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf_bytes is not None:  # before connect, so the advertised window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", int(gateway.base_url.rsplit(":", 1)[1])))
    return sock


def _start_stream_and_stop_reading(gateway: RunningGateway) -> tuple[socket.socket, str]:
    """A streaming request whose client reads the response head and then nothing more."""
    sock = _connect(gateway, rcvbuf_bytes=1024)
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me everything."}],
            "max_tokens": LONG_MAX_TOKENS,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nAuthorization: Bearer {ACME_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(256)
        assert chunk, "the gateway closed the connection before answering"
        received += chunk
    status_line, *header_lines = received.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    assert status_line.startswith("HTTP/1.1 200"), received
    headers = dict(line.split(": ", 1) for line in header_lines)
    return sock, headers["x-request-id"]


def _in_flight(gateway: RunningGateway) -> float:
    value = gateway.gw.metrics.registry.get_sample_value("sluice_gateway_requests_in_flight")
    assert value is not None
    return value


def test_a_client_that_stops_reading_is_cancelled_metered_and_freed_while_others_stream(
    gateway: RunningGateway, engine: ScriptedFakeEngine
) -> None:
    sock, request_id = _start_stream_and_stop_reading(gateway)
    stopped_reading_s = time.monotonic()
    try:
        # Another tenant streams meanwhile, start to finish.
        stream = gateway.client(GLOBEX_KEY).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=64,
            stream=True,
        )
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert gateway.usage_row(chunks[0].id, api_key=GLOBEX_KEY)["status"] == "finished"

        row = gateway.usage_row(request_id, timeout_s=WRITE_TIMEOUT_S + 10)
        assert time.monotonic() - stopped_reading_s < WRITE_TIMEOUT_S + 10
        assert row["status"] == "cancelled" and 0 < row["output_tokens"] < LONG_MAX_TOKENS
        # Its engine call was cancelled and its slot released (both before its usage row was written).
        assert request_id in engine.cancelled and _in_flight(gateway) == 0
        # The connection itself was closed (reset: what it had buffered is dropped).
        with pytest.raises(OSError):
            while sock.recv(65536):
                pass
    finally:
        sock.close()


def test_a_request_head_not_finished_in_time_closes_the_connection(gateway: RunningGateway) -> None:
    for partial in (b"", b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n"):
        sock = _connect(gateway)
        try:
            sock.sendall(partial)
            started_s = time.monotonic()
            answer = sock.recv(65536)  # blocks until the gateway closes it (timeout 10 s)
            assert time.monotonic() - started_s < 5.0
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408")
        finally:
            sock.close()


def test_a_request_head_over_the_bound_is_refused(gateway: RunningGateway) -> None:
    sock = _connect(gateway)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\nX-Padding: " + b"a" * 16384 + b"\r\n\r\n")
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 431"), answer
    finally:
        sock.close()
    # A head under the bound is served as usual.
    with gateway.http() as http:
        assert http.get("/healthz", headers={"X-Padding": "a" * 1024}).status_code == 200


def test_past_the_connection_limit_a_request_gets_an_api_shaped_503(
    dev_checkpoint: Path, tmp_path: Path, engine: ScriptedFakeEngine
) -> None:
    gateway = start_gateway(tmp_path, dev_checkpoint, engine=engine, max_connections=2)
    idle = [_connect(gateway) for _ in range(2)]  # connected, nothing sent: they count all the same
    try:
        with gateway.http() as http:
            resp = http.get("/v1/models", headers={"Authorization": f"Bearer {ACME_KEY}"})
        assert resp.status_code == 503
        assert resp.json()["error"]["code"] == "gateway_connection_limit"
        assert resp.headers["retry-after"] == "1" and resp.headers["retry-after-ms"] == "1000"
    finally:
        for sock in idle:
            sock.close()
        gateway.stop()


def test_a_shutdown_cancels_and_meters_streams_still_running_after_its_grace(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    # A stream that would run for ~20 s; the gateway is told to stop 0.5 s in, with 1 s of grace.
    engine = ScriptedFakeEngine(TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0], interval_s=0.01)
    gateway = start_gateway(
        tmp_path, dev_checkpoint, engine=engine, max_output_tokens=LONG_MAX_TOKENS, shutdown_grace_s=1
    )
    stream = gateway.client().completions.create(
        model=MODEL, prompt="Tell me everything.", max_tokens=LONG_MAX_TOKENS, stream=True
    )
    request_id = next(iter(stream)).id
    time.sleep(0.5)
    started_s = time.monotonic()
    gateway.stop()
    assert not gateway.thread.is_alive() and time.monotonic() - started_s < 10
    with sqlite3.connect(tmp_path / "sluice.db") as db:
        status, output_tokens = db.execute(
            "SELECT status, output_tokens FROM usage WHERE request_id = ?", (request_id,)
        ).fetchone()
    assert status == "cancelled" and 0 < output_tokens < LONG_MAX_TOKENS
    assert request_id in engine.cancelled
