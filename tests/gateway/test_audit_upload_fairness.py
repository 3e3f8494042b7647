"""Audit: a gateway's upload slots (``SLUICE_FILE_MAX_CONCURRENT_UPLOADS``) are taken after the key is
checked and at most half of them by one tenant. A tenant trickling the bodies of many uploads (each holds
its slot until its body is in) holds two of four slots, and another tenant's upload goes through at once;
a caller without a valid key holds none (401 before its body is read)."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, GLOBEX_KEY, start_gateway, wait_until

import gateway.upload_slots as upload_slots

LINES = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n'


def start_slow_upload(base_url: str, api_key: str) -> socket.socket:
    """An upload whose headers are sent and its body held back."""
    where = urlsplit(base_url)
    sock = socket.create_connection((where.hostname or "127.0.0.1", where.port or 80))
    sock.sendall(
        (
            f"POST /v1/files HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {api_key}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 4096\r\n\r\n--b\r\n"
        ).encode()
    )
    return sock


def test_one_tenant_holds_at_most_half_the_upload_slots(
    dev_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upload_slots, "SLOT_WAIT_S", 0.3)
    running = start_gateway(
        tmp_path, dev_checkpoint, engine=ScriptedFakeEngine(5, 0.001), file_max_concurrent_uploads=4
    )
    limit = running.gw.upload_limit
    slow: list[socket.socket] = []
    try:
        unauthenticated = start_slow_upload(running.base_url, "sk-nobody")
        unauthenticated.settimeout(5)
        assert unauthenticated.recv(64).startswith(b"HTTP/1.1 401")  # refused at once, body unread
        assert limit.num_in_use == 0
        slow = [start_slow_upload(running.base_url, ACME_KEY) for _ in range(4)]
        wait_until(lambda: limit.num_in_use == 2, 10, "acme's slow uploads holding their share")
        time.sleep(0.5)  # acme's other two waited for a slot of its own and were refused
        assert limit.num_in_use == 2
        with pytest.raises(openai.InternalServerError) as refused:
            running.client().files.create(file=("a.jsonl", LINES), purpose="batch")
        assert refused.value.response.json()["error"]["code"] == "too_many_uploads"
        started_s = time.monotonic()
        stored = running.client(GLOBEX_KEY).files.create(file=("g.jsonl", LINES), purpose="batch")
        assert stored.bytes == len(LINES) and time.monotonic() - started_s < 0.3  # no wait for a slot
    finally:
        for sock in slow:
            sock.close()
        running.stop()
    assert limit.num_in_use == 0
