"""sluice_client against `make run`'s process (gateway.devstack: tritonserver, control plane, gateway),
started once for the module on free ports with its own state directory.

- The same Idempotency-Key on a retry, through a proxy that loses the first response: a whole completion
  is replayed, never run twice (exactly one usage row for the key); a stream cut before its first event
  starts over and ends with exactly one finished row for the key.
- 429 with retry-after-ms honoured: a tenant allowed one request at a time calls while its stream runs;
  the client waits as told and gets through once the stream is closed.
- Closing a stream (sync) or cancelling its task (async) hangs up: the gateway's usage row says
  cancelled, with fewer output tokens than max_tokens.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from drop_proxy import ResponseDropProxy
from ports import free_ports

from sluice.domain import Tenant
from sluice.stores.tenants.store import SqliteTenantStore
from sluice_client import AsyncSluiceClient, SluiceClient

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "sluice-tiny"
DEV_KEY = "sk-acme-dev"
MESSAGES = [{"role": "user", "content": "Hello"}]
LONG_TOKENS = 500  # a generation still running when the test hangs up (the dev model is fast)
FAST: dict[str, Any] = {"backoff_initial_s": 0.05, "backoff_max_s": 0.5}


@dataclass(frozen=True)
class DevStack:
    url: str
    single_key: str  # a tenant allowed one request at a time


@pytest.fixture(scope="module")
def stack(
    dev_checkpoint: Path, model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevStack]:
    state_dir = tmp_path_factory.mktemp("client_devstack")
    single_key = create_tenant(state_dir, Tenant("single", "Single", max_concurrent_requests=1))
    http, grpc, metrics, gateway, control_plane = free_ports(5)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        SLUICE_STATE_DIR=str(state_dir),
        SLUICE_CHECKPOINT_DIR=str(dev_checkpoint),
        SLUICE_GATEWAY_PORT=str(gateway),
        SLUICE_CONTROL_PLANE_PORT=str(control_plane),
        SLUICE_TRITON_GRPC_URL=f"127.0.0.1:{grpc}",
        SLUICE_TRITON_METRICS_URL=f"http://127.0.0.1:{metrics}/metrics",
        SLUICE_DEV_TENANTS="true",  # as `make run` sets it
    )
    log_path = state_dir / "devstack.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.devstack", "--model-repository", str(model_repository),
             "--triton-http-port", str(http)],
            cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{gateway}/readyz", proc, log_path)
        yield DevStack(f"http://127.0.0.1:{gateway}", single_key)
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: it stops tritonserver and the control plane
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def create_tenant(state_dir: Path, tenant: Tenant) -> str:
    async def create() -> str:
        store = SqliteTenantStore(state_dir / "sluice.db")
        await store.open()
        try:
            return await store.create(tenant)
        finally:
            await store.close()

    return asyncio.run(create())


def wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)  # nothing to await: the stack is another process
    raise AssertionError(f"the dev stack did not become ready:\n{log_path.read_text()[-3000:]}")


def usage_rows(client: SluiceClient, key: str, num_rows: int) -> list[dict[str, Any]]:
    """The key's usage rows once ``num_rows`` are written (a request's row follows its end)."""
    deadline = time.monotonic() + 10
    while True:
        rows = sorted(client.usage(idempotency_key=key)["data"], key=lambda row: row["attempt"])
        if len(rows) >= num_rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)  # another process writes it: poll


def test_a_lost_response_is_retried_with_the_same_key_and_replayed(stack: DevStack) -> None:
    proxy = ResponseDropProxy(int(stack.url.rsplit(":", 1)[1]), num_drops=1)
    try:
        with SluiceClient(f"http://127.0.0.1:{proxy.port}/v1", DEV_KEY, **FAST) as client:
            reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    finally:
        proxy.close()
    assert proxy.num_connections >= 2  # the lost one, then the retry(s)
    assert reply.usage is not None and reply.usage["completion_tokens"] >= 1
    with SluiceClient(stack.url, DEV_KEY) as client:
        assert reply.idempotency_key is not None
        rows = usage_rows(client, reply.idempotency_key, 1)
    assert [(row["attempt"], row["status"]) for row in rows] == [(1, "finished")]  # run once, replayed


def test_a_stream_cut_before_its_first_event_starts_over(stack: DevStack) -> None:
    async def run(port: int) -> tuple[str, str]:
        async with AsyncSluiceClient(f"http://127.0.0.1:{port}", DEV_KEY, **FAST) as client:
            stream = await client.completions.create(model=MODEL, prompt="def", max_tokens=8, stream=True)
            async with stream:
                text = "".join([chunk.text async for chunk in stream])
            assert stream.idempotency_key is not None
            return text, stream.idempotency_key

    proxy = ResponseDropProxy(int(stack.url.rsplit(":", 1)[1]), num_drops=1)
    try:
        text, key = asyncio.run(run(proxy.port))
    finally:
        proxy.close()
    assert text and proxy.num_connections >= 2
    with SluiceClient(stack.url, DEV_KEY) as client:
        rows = usage_rows(client, key, 1)
        if rows[-1]["status"] != "finished":  # the cancelled first attempt's row came first
            rows = usage_rows(client, key, 2)
    # The first attempt finished before the gateway saw the hang-up (its result replayed), or was
    # cancelled and the retry ran as attempt 2: either way one finished row.
    assert [row["status"] for row in rows] in (["finished"], ["cancelled", "finished"]), rows
    assert all(row["idempotency_key"] == key for row in rows)


class _RetryLog(logging.Handler):
    """Catches the client's retry log lines, so the test knows when a call was refused."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self.retried = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.retried.set()


def test_429_is_waited_out_and_closing_a_stream_cancels_it(stack: DevStack) -> None:
    caught = _RetryLog()
    logger = logging.getLogger("sluice_client")
    logger.addHandler(caught)
    logger.setLevel(logging.INFO)
    result: list[Any] = []
    try:
        with SluiceClient(stack.url, stack.single_key, **FAST) as client:
            holder = client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=LONG_TOKENS, ignore_eos=True, stream=True
            )
            assert next(holder).body["object"] == "chat.completion.chunk"
            second = threading.Thread(
                target=lambda: result.append(client.completions.create(model=MODEL, prompt="x", max_tokens=4))
            )
            second.start()
            assert caught.retried.wait(10), "the second call should have been refused while the stream ran"
            refused_at_s = time.monotonic()
            holder.close()  # hang up: the gateway cancels it and frees the tenant's one slot
            second.join(20)
            done_at_s = time.monotonic()
            assert result and result[0].usage["completion_tokens"] >= 1
            (record,) = caught.records[:1]
            assert "HTTP 429 concurrent_requests_exceeded" in record.getMessage()
            advised_s = record.retry_wait_s  # type: ignore[attr-defined]
            assert 0 < advised_s <= 1.0 and done_at_s - refused_at_s >= advised_s * 0.9
            assert holder.idempotency_key is not None
            (row,) = usage_rows(client, holder.idempotency_key, 1)
    finally:
        logger.removeHandler(caught)
    assert row["status"] == "cancelled" and 1 <= row["output_tokens"] < LONG_TOKENS, row


def test_cancelling_the_reading_task_cancels_the_generation(stack: DevStack) -> None:
    async def run() -> list[dict[str, Any]]:
        async with AsyncSluiceClient(stack.url, DEV_KEY) as client:
            first = asyncio.Event()
            keys: list[str] = []

            async def read() -> None:
                stream = await client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=LONG_TOKENS, ignore_eos=True, stream=True
                )
                assert stream.idempotency_key is not None
                keys.append(stream.idempotency_key)
                async for _ in stream:
                    first.set()

            task = asyncio.create_task(read())
            await first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # Still inside the client: only the stream's own hang-up can have ended the request.
            deadline = time.monotonic() + 10
            while not (rows := (await client.usage(idempotency_key=keys[0]))["data"]):
                assert time.monotonic() < deadline, "no usage row for the cancelled stream"
                await asyncio.sleep(0.1)  # another process writes it: poll
            return rows

    (row,) = asyncio.run(run())
    assert row["status"] == "cancelled" and 1 <= row["output_tokens"] < LONG_TOKENS, row
