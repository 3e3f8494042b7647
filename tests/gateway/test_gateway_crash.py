"""Issue 9: a gateway killed mid-stream loses no usage. A real gateway process (``python -m gateway``, the
in-process engine, SQLite under a temporary state_dir) streams a long completion; once the usage outbox
holds a checkpoint of it, the process is frozen (SIGSTOP, so the file cannot move), its outbox read, then
it is killed with SIGKILL. A gateway started again on the same state_dir bills the request: status
``gateway_lost``, the prompt, and exactly the output tokens of its last checkpoint on disk (> 0, and no more
than the replica produced)."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from harness import ACME_KEY, MODEL, GatewayProcess, gateway_process, start_gateway

from gateway.metering.outbox import FILE_NAME

MAX_TOKENS = 1900  # the dev model's context is 2048: a stream of a second or more on this engine
AUTH = {"Authorization": f"Bearer {ACME_KEY}"}


@pytest.fixture
def crashing_gateway(dev_checkpoint: Path, tmp_path: Path) -> Iterator[GatewayProcess]:
    with gateway_process(tmp_path, dev_checkpoint, max_output_tokens=str(MAX_TOKENS)) as gateway:
        yield gateway


def outbox_of(path: Path, request_id: str) -> dict[str, Any]:
    """What the outbox file says of ``request_id`` now: its seq, whether it is open or closed, and the
    output tokens of its checkpoints (a torn last line is skipped, as the outbox itself does)."""
    found: dict[str, Any] = {"seq": None, "closed": False, "checkpoints": []}
    for raw in path.read_bytes().splitlines(keepends=True):
        if not raw.endswith(b"\n"):
            continue
        line = json.loads(raw)
        if line.get("open", {}).get("request_id") == request_id:
            found["seq"] = line["seq"]
        elif line["seq"] == found["seq"]:
            if "ckpt" in line:
                found["checkpoints"].append(line["ckpt"]["output_tokens"])
            else:
                found["closed"] = True
    return found


def test_a_gateway_killed_mid_stream_bills_the_request_at_its_next_start(
    crashing_gateway: GatewayProcess, dev_checkpoint: Path, tmp_path: Path
) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True}
    headers = {**AUTH, "Idempotency-Key": "k-crash"}
    outbox = tmp_path / "outbox" / FILE_NAME
    request_id, num_events, on_disk = "", 0, {}
    with (
        httpx.Client(base_url=crashing_gateway.base_url, timeout=30) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as resp,
    ):
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            num_events += 1
            if not request_id:
                request_id = json.loads(line[len("data: ") :])["id"]
                # Durable before the replica started: a crash from the first token on is billed.
                assert outbox_of(outbox, request_id)["seq"] is not None
            if outbox_of(outbox, request_id)["checkpoints"]:
                os.kill(crashing_gateway.proc.pid, signal.SIGSTOP)  # frozen: the outbox cannot move now
                on_disk = outbox_of(outbox, request_id)
                os.kill(crashing_gateway.proc.pid, signal.SIGKILL)
                break
    assert crashing_gateway.proc.wait(10) == -signal.SIGKILL
    assert on_disk, "the stream ended before a checkpoint reached the outbox"
    assert not on_disk["closed"], "the request had ended before the kill: nothing was lost"
    last_checkpoint = on_disk["checkpoints"][-1]
    assert 0 < last_checkpoint <= MAX_TOKENS and num_events >= 1

    restarted = start_gateway(tmp_path, dev_checkpoint, engine_client="inprocess", dev_tenants=True)
    try:
        row = restarted.usage_row(request_id)
        assert row["status"] == "gateway_lost"
        assert row["output_tokens"] == last_checkpoint  # what the replica had produced by then
        assert row["prompt_tokens"] >= 1
        assert (row["idempotency_key"], row["attempt"]) == ("k-crash", 1)
        assert restarted.gw.meter.num_pending == 0
    finally:
        restarted.stop()
