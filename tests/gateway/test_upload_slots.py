"""A gateway reads at most ``file_max_concurrent_uploads`` uploads at once (``gateway.upload_slots``):
with one slot held by an upload whose body is still coming, the next upload waits, then is refused with
503 ``too_many_uploads`` and Retry-After before its body is read; the slot comes back when the first
client goes away, and the next upload is stored. A body that does not arrive within
``file_upload_timeout_s`` is answered 408 ``upload_timeout`` and its slot comes back. The gateway runs the
scripted fake engine: files reach no engine."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, RunningGateway, start_gateway, wait_until

import gateway.upload_slots as upload_slots

LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'
SLOT_WAIT_S = 0.3


@pytest.fixture
def gateway(
    dev_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[RunningGateway]:
    monkeypatch.setattr(upload_slots, "SLOT_WAIT_S", SLOT_WAIT_S)  # read at each upload
    running = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=ScriptedFakeEngine(token_id=5, interval_s=0.001),
        file_max_concurrent_uploads=1,
    )
    yield running
    running.stop()


def start_slow_upload(base_url: str) -> socket.socket:
    """An upload whose headers and first body bytes are sent, the rest held back: it holds a slot."""
    where = urlsplit(base_url)
    sock = socket.create_connection((where.hostname or "127.0.0.1", where.port or 80))
    boundary = "sluice-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="slow.jsonl"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    sock.sendall(
        (
            "POST /v1/files HTTP/1.1\r\n"
            f"Host: {where.netloc}\r\n"
            f"Authorization: Bearer {ACME_KEY}\r\n"
            f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
            "Content-Length: 4096\r\n\r\n"
        ).encode()
        + head
    )
    return sock


def test_an_upload_past_the_slots_is_refused_before_its_body_is_read(gateway: RunningGateway) -> None:
    client = gateway.client()
    slow = start_slow_upload(gateway.base_url)
    try:
        wait_until(lambda: gateway.gw.upload_limit.num_in_use == 1, 10, "the slow upload holding the slot")
        started_s = time.monotonic()
        with pytest.raises(openai.InternalServerError) as refused:
            client.files.create(file=("next.jsonl", LINES), purpose="batch")
        waited_s = time.monotonic() - started_s
        error = refused.value.response.json()["error"]
        assert (refused.value.status_code, error["code"]) == (503, "too_many_uploads"), error
        assert "SLUICE_FILE_MAX_CONCURRENT_UPLOADS" in error["message"]
        assert float(refused.value.response.headers["Retry-After"]) > 0
        assert waited_s >= SLOT_WAIT_S  # it waited for a slot before it was refused
    finally:
        slow.close()  # the client goes away mid-body: its slot comes back
    wait_until(lambda: gateway.gw.upload_limit.num_in_use == 0, 10, "the slot given back")
    stored = client.files.create(file=("after.jsonl", LINES), purpose="batch")
    assert stored.bytes == len(LINES)
    # Given back once the response is sent (just after the client has it).
    wait_until(lambda: gateway.gw.upload_limit.num_in_use == 0, 10, "the slot given back again")


def _read_response(sock: socket.socket) -> str:
    """One whole HTTP response: its head, then Content-Length bytes of body (the two may come in separate
    segments: one recv() once read the head alone)."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    declared = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    length = int(declared.group(1)) if declared else 0
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return (head + b"\r\n\r\n" + body).decode(errors="replace")


def test_a_body_that_does_not_arrive_in_time_is_408_and_gives_its_slot_back(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    gateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=ScriptedFakeEngine(token_id=5, interval_s=0.001),
        file_max_concurrent_uploads=1,
        file_upload_timeout_s=0.5,
    )
    try:
        slow = start_slow_upload(gateway.base_url)  # 4096 bytes announced, a few hundred sent
        try:
            slow.settimeout(10)
            answer = _read_response(slow)
        finally:
            slow.close()
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        assert '"code":"upload_timeout"' in answer.replace(" ", ""), answer
        wait_until(lambda: gateway.gw.upload_limit.num_in_use == 0, 10, "the slot given back")
        stored = gateway.client().files.create(file=("next.jsonl", LINES), purpose="batch")
        assert stored.bytes == len(LINES)
    finally:
        gateway.stop()
