"""UsageMeter over a real SQLite ledger: the ledger's failures and hangs never reach the caller, pending
records are written once it is back or after a restart, and replays never double a row."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.metering.outbox import FILE_NAME, Outbox
from gateway.metering.pipeline import OpenUsage, UsageMeter
from sluice.domain import Outcome, UsageRecord, UsageReport
from sluice.stores.ledger.base import TenantUsage, UsageLedger, VersionTraffic
from sluice.stores.ledger.store import SqliteLedger

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def rec(i: int, **kw: object) -> UsageRecord:
    r = UsageRecord("acme", f"req-{i}", "sluice-tiny", "1", 10, i, Outcome.FINISHED, T0, T0 + timedelta(1))
    return dataclasses.replace(r, **kw)  # type: ignore[arg-type]


class SwitchableLedger(UsageLedger):
    """A real ledger whose writes can be made to fail (``down``) or hang (``hang``) on purpose."""

    def __init__(self, inner: UsageLedger) -> None:
        self.inner = inner
        self.down = False
        self.hang = False
        self.num_writes = 0

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def record(self, rec: UsageRecord) -> bool:
        self.num_writes += 1
        if self.hang:
            await asyncio.sleep(3600)
        if self.down:
            raise ConnectionError("ledger unreachable (on purpose)")
        return await self.inner.record(rec)

    async def query(self, tenant_id: str, **kw: object) -> UsageReport:
        return await self.inner.query(tenant_id, **kw)  # type: ignore[arg-type]

    async def version_traffic(self, model: str, since: datetime) -> list[VersionTraffic]:
        return await self.inner.version_traffic(model, since)

    async def usage_by_tenant(self, **kw: Any) -> list[TenantUsage]:
        return await self.inner.usage_by_tenant(**kw)


@pytest.fixture
async def ledger(tmp_path: Path) -> AsyncIterator[SwitchableLedger]:
    ledger = SwitchableLedger(SqliteLedger(tmp_path / "sluice.db"))
    await ledger.open()
    yield ledger
    await ledger.close()


def meter_over(ledger: UsageLedger, tmp_path: Path, **kw: object) -> UsageMeter:
    fast: dict[str, object] = dict(write_timeout_s=0.2, retry_initial_s=0.02, retry_max_s=0.1)
    return UsageMeter(ledger, Outbox(tmp_path / "outbox"), **{**fast, **kw})  # type: ignore[arg-type]


async def rows(ledger: UsageLedger) -> dict[str, int]:
    return {r.request_id: r.output_tokens for r in (await ledger.query("acme", limit=1000)).rows}


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_with_the_ledger_up_a_record_is_written_before_record_returns(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    written: list[int] = []
    meter = meter_over(ledger, tmp_path, on_written=lambda: written.append(1))
    await meter.open()
    await asyncio.gather(*(meter.record(rec(i)) for i in range(20)))
    assert await rows(ledger) == {f"req-{i}": i for i in range(20)}
    assert (meter.num_pending, meter.num_written, len(written), meter.num_failed_attempts) == (0, 20, 20, 0)
    await meter.close()
    reopened = meter_over(ledger, tmp_path)
    await reopened.open()
    assert reopened.num_pending == 0  # every done line reached the outbox
    await reopened.close()


async def test_a_ledger_outage_is_absorbed_logged_once_and_caught_up(
    ledger: SwitchableLedger, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    failures: list[int] = []
    meter = meter_over(ledger, tmp_path, on_ledger_failure=lambda: failures.append(1))
    await meter.open()
    ledger.down = True
    with caplog.at_level(logging.WARNING, logger="gateway.metering.pipeline"):
        await asyncio.gather(*(meter.record(rec(i)) for i in range(30)))  # none raises
        await asyncio.sleep(0.3)  # a few retries fail too
        assert meter.num_pending == 30 and meter.ledger_down
        assert await rows(ledger) == {}
        num_attempts_down = ledger.num_writes
        ledger.down = False
        await until(lambda: meter.num_pending == 0)
    assert await rows(ledger) == {f"req-{i}": i for i in range(30)}
    assert meter.num_written == 30 and meter.num_outages == 1 and not meter.ledger_down
    assert len(failures) == meter.num_failed_attempts >= 1
    # While down, retries probe with one record per backoff step instead of retrying all 30.
    assert num_attempts_down < 30 + 20, num_attempts_down
    unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(unavailable) == 1  # once per outage, not per record
    await meter.close()


async def test_a_hanging_ledger_holds_record_for_the_write_timeout_only(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    meter = meter_over(ledger, tmp_path, write_timeout_s=0.2)
    await meter.open()
    ledger.hang = True
    t0 = time.monotonic()
    await meter.record(rec(1))
    assert time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    await meter.record(rec(2))  # known down now: append only, no wait
    assert time.monotonic() - t0 < 0.1
    assert meter.num_pending == 2
    ledger.hang = False
    await until(lambda: meter.num_pending == 0)
    assert await rows(ledger) == {"req-1": 1, "req-2": 2}
    await meter.close()


async def test_records_pending_at_close_are_written_after_a_restart(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    meter = meter_over(ledger, tmp_path)
    await meter.open()
    ledger.down = True
    for i in range(5):
        await meter.record(rec(i))
    await meter.close()
    assert meter.num_pending == 5
    ledger.down = False
    restarted = meter_over(ledger, tmp_path)
    await restarted.open()
    await until(lambda: restarted.num_pending == 0)
    assert await rows(ledger) == {f"req-{i}": i for i in range(5)}
    await restarted.close()


async def test_the_same_record_replayed_twice_leaves_one_row(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    box = Outbox(tmp_path / "outbox")
    await box.open()
    await box.append(rec(7))
    await box.append(rec(7))  # e.g. a record written, its done line lost, then written again
    await box.append(rec(7, attempt=2, output_tokens=3))  # the same request id again: never a change
    await box.close()
    meter = meter_over(ledger, tmp_path)
    await meter.open()
    await until(lambda: meter.num_pending == 0)
    report = await ledger.query("acme")
    assert [(r.request_id, r.attempt, r.output_tokens) for r in report.rows] == [("req-7", 1, 7)]
    assert report.totals.num_requests == 1
    await meter.close()


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


async def begun(meter: UsageMeter, record: UsageRecord) -> OpenUsage:
    """``begin`` and wait for the open line: as a request is by its first output."""
    usage = meter.begin(record)
    await meter.opened(usage)
    return usage


def checkpoints(tmp_path: Path) -> list[int]:
    """The output tokens of every checkpoint line in the outbox file, in order."""
    lines = [json.loads(line) for line in (tmp_path / "outbox" / FILE_NAME).read_text().splitlines()]
    return [obj["ckpt"]["output_tokens"] for obj in lines if "ckpt" in obj]


async def test_checkpoints_come_every_64_tokens_or_every_second_whichever_first(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    clock = FakeClock()
    meter = meter_over(ledger, tmp_path, clock=clock)
    await meter.open()
    usage = await begun(meter, rec(1, output_tokens=0))
    for tokens in range(1, 64):  # a fast stream: one token at a time, well within a second
        meter.checkpoint(usage, tokens)
    meter.checkpoint(usage, 64)  # 64 tokens since the last one
    meter.checkpoint(usage, 64)  # nothing new
    for tokens in range(65, 101):
        meter.checkpoint(usage, tokens)
    clock.now_s += 0.5
    meter.checkpoint(usage, 110)
    clock.now_s += 0.5  # a slow stream: a second since the checkpoint at 64
    meter.checkpoint(usage, 111)
    clock.now_s += 5.0
    meter.checkpoint(usage, 111)  # no new token: nothing to checkpoint, however long it was
    meter.checkpoint(usage, 112)  # the next token, 5 s after the last checkpoint
    for tokens in range(113, 176):
        meter.checkpoint(usage, tokens)
    meter.checkpoint(usage, 176)  # 64 since the checkpoint at 112
    await meter.record(rec(1, output_tokens=180), usage)
    assert checkpoints(tmp_path) == [64, 111, 112, 176]
    assert await rows(ledger) == {"req-1": 180}
    await meter.close()


async def test_a_request_left_open_is_billed_at_the_next_start_as_gateway_lost(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    clock = FakeClock()
    meter = meter_over(ledger, tmp_path, clock=clock)
    await meter.open()
    lost = await begun(meter, rec(1, output_tokens=0, idempotency_key="k", attempt=2))
    closed = await begun(meter, rec(2, output_tokens=0))
    never_ran = await begun(meter, rec(3, output_tokens=0))
    await begun(meter, rec(4, output_tokens=0))  # died before its first checkpoint
    meter.checkpoint(lost, 64)
    clock.now_s += 1.0
    meter.checkpoint(lost, 70)  # the last one before the process goes away
    meter.checkpoint(closed, 64)
    await meter.record(rec(2, output_tokens=80), closed)
    meter.discard(never_ran)
    await meter.close()  # lost and unchecked were still running: as after a kill -9
    assert await rows(ledger) == {"req-2": 80}

    restarted = meter_over(ledger, tmp_path)
    await restarted.open()
    await until(lambda: restarted.num_pending == 0)
    report = await ledger.query("acme")
    by_id = {r.request_id: r for r in report.rows}
    assert by_id.keys() == {"req-1", "req-2", "req-4"}
    billed = by_id["req-1"]
    assert (billed.status, billed.output_tokens) == (Outcome.GATEWAY_LOST, 70)
    assert (billed.idempotency_key, billed.attempt, billed.prompt_tokens) == ("k", 2, 10)
    assert billed.finished_at > billed.started_at  # the last checkpoint's time
    assert (by_id["req-4"].status, by_id["req-4"].output_tokens) == (Outcome.GATEWAY_LOST, 0)
    assert (by_id["req-2"].status, by_id["req-2"].output_tokens) == (Outcome.FINISHED, 80)
    await restarted.close()
    again = meter_over(ledger, tmp_path)  # billed once: nothing is left open or pending
    await again.open()
    assert again.num_pending == 0
    await again.close()


async def test_a_request_whose_output_restarted_is_billed_after_a_crash_for_the_new_output_only(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    """A re-dispatch starts the answer again: the lost replica's checkpoint must not stand for it."""
    meter = meter_over(ledger, tmp_path)
    await meter.open()
    redispatched = await begun(meter, rec(1, output_tokens=0))
    meter.checkpoint(redispatched, 64)  # the lost replica's tokens, which the client never saw
    meter.restart(redispatched)
    meter.checkpoint(redispatched, 10)  # the new replica's: under 64 since the restart, not written
    untouched = await begun(meter, rec(2, output_tokens=0))
    meter.restart(untouched)  # nothing checkpointed yet: nothing to write
    await meter.close()  # both still running: as after a kill -9
    assert checkpoints(tmp_path) == [64, 0]

    restarted = meter_over(ledger, tmp_path)
    await restarted.open()
    await until(lambda: restarted.num_pending == 0)
    by_id = {r.request_id: r for r in (await ledger.query("acme")).rows}
    assert (by_id["req-1"].status, by_id["req-1"].output_tokens) == (Outcome.GATEWAY_LOST, 0)
    assert (by_id["req-2"].status, by_id["req-2"].output_tokens) == (Outcome.GATEWAY_LOST, 0)
    await restarted.close()


async def test_a_begin_does_not_wait_for_the_disk_and_a_caller_cancelled_in_opened_is_billed_once(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    """``begin`` returns before its open line is written (the replica starts meanwhile); ``opened`` waits
    for it. A request whose client left while it waited (cancelled) still ends through ``record``."""
    meter = meter_over(ledger, tmp_path)
    await meter.open()
    usage = meter.begin(rec(1, output_tokens=0))
    assert usage.seq is not None and usage.opening is not None and not usage.opening.done()
    waiter = asyncio.create_task(meter.opened(usage))
    await asyncio.sleep(0)  # it waits for the open line's fsync
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    await meter.opened(usage)  # no wait after the first
    await meter.record(rec(1, output_tokens=3), usage)
    await meter.close()
    restarted = meter_over(ledger, tmp_path)
    await restarted.open()
    assert restarted.num_pending == 0  # closed by its record: not billed again as lost
    await restarted.close()
    assert await rows(ledger) == {"req-1": 3}


async def test_an_open_line_the_disk_refused_leaves_the_request_running_unprotected(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    disk_failed = False

    def fsync(fd: int) -> None:
        if disk_failed:
            raise OSError(5, "Input/output error")
        os.fsync(fd)

    meter = UsageMeter(ledger, Outbox(tmp_path / "outbox", fsync=fsync))
    await meter.open()
    disk_failed = True
    usage = meter.begin(rec(1, output_tokens=0))
    await meter.opened(usage)  # does not raise: the request runs on
    assert usage.seq is None  # and the outbox holds nothing of it: no checkpoints
    meter.checkpoint(usage, 64)
    await meter.record(rec(1, output_tokens=64), usage)  # the ledger takes what the disk did not
    assert await rows(ledger) == {"req-1": 64}
    await meter.close()


async def test_latencies_reach_the_ledger_and_an_older_gateways_line_replays_without_them(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    (tmp_path / "outbox").mkdir()
    old = {"seq": 1, "rec": {"tenant_id": "acme", "request_id": "req-old", "model": "sluice-tiny",
                             "model_version": "1", "prompt_tokens": 10, "output_tokens": 4,
                             "status": "finished", "started_at": T0.isoformat(),
                             "finished_at": T0.isoformat()}}  # fmt: skip
    (tmp_path / "outbox" / FILE_NAME).write_text(json.dumps(old) + "\n")
    meter = meter_over(ledger, tmp_path)
    await meter.open()
    await until(lambda: meter.num_pending == 0)
    await meter.record(rec(1, ttft_ms=80.5, itl_p95_ms=12.25))
    by_id = {r.request_id: r for r in (await ledger.query("acme")).rows}
    replayed = by_id["req-old"]
    assert (replayed.output_tokens, replayed.ttft_ms, replayed.itl_p95_ms) == (4, None, None)
    assert (by_id["req-1"].ttft_ms, by_id["req-1"].itl_p95_ms) == (80.5, 12.25)
    await meter.close()


async def test_an_invalid_record_is_refused_before_the_outbox(
    ledger: SwitchableLedger, tmp_path: Path
) -> None:
    meter = meter_over(ledger, tmp_path)
    await meter.open()
    with pytest.raises(ValueError, match=">= 0"):
        await meter.record(rec(1, output_tokens=-1))
    assert meter.num_pending == 0
    await meter.close()
