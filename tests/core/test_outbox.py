"""The usage outbox: durable across reopen and kill -9, torn lines ignored, group commit, compaction."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gateway.metering.outbox import FILE_NAME, Outbox
from sluice.domain import Outcome, RequestClass, UsageRecord

pytestmark = pytest.mark.anyio

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def rec(i: int, **kw: object) -> UsageRecord:
    r = UsageRecord("acme", f"req-{i}", "sluice-tiny", "1", 10, i, Outcome.FINISHED, T0, T0 + timedelta(1))
    return dataclasses.replace(r, **kw)  # type: ignore[arg-type]


class CountingFsync:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.num_calls = 0
        self.delay_s = delay_s

    def __call__(self, fd: int) -> None:
        self.num_calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)  # a disk's flush latency
        os.fsync(fd)


async def append_open(box: Outbox, record: UsageRecord) -> int:
    """Open a request and wait for its open line, as a request does before its first output."""
    seq, written = box.open_nowait(record)
    await written
    return seq


async def opened(directory: Path, **kw: object) -> tuple[Outbox, list[tuple[int, UsageRecord]]]:
    box = Outbox(directory, **kw)  # type: ignore[arg-type]
    return box, await box.open()


async def test_pending_records_survive_a_reopen_and_done_ones_do_not(tmp_path: Path) -> None:
    box, left = await opened(tmp_path / "outbox")
    assert left == []
    seqs = [await box.append(rec(i, attempt=1 + i % 2, status=Outcome.CANCELLED)) for i in range(4)]
    box.mark_done(seqs[1])
    box.mark_done(seqs[3])
    await box.close()
    box, left = await opened(tmp_path / "outbox")
    assert left == [(seqs[0], rec(0, status=Outcome.CANCELLED)), (seqs[2], rec(2, status=Outcome.CANCELLED))]
    assert await box.append(rec(9)) > max(seqs)  # seqs never repeat across runs
    await box.close()


async def test_a_torn_last_line_is_ignored_and_later_appends_are_not_lost(tmp_path: Path) -> None:
    box, _ = await opened(tmp_path)
    await box.append(rec(1))
    await box.close()
    with open(tmp_path / FILE_NAME, "ab") as f:  # a process killed halfway through a line
        f.write(b'{"seq":2,"rec":{"tenant_id":"acme","request_')
    box, left = await opened(tmp_path)
    assert [r for _, r in left] == [rec(1)] and box.num_torn_lines == 1
    await box.append(rec(3))
    await box.close()
    box, left = await opened(tmp_path)
    assert [r for _, r in left] == [rec(1), rec(3)] and box.num_torn_lines == 0
    await box.close()


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    """Group commit: N appends arriving over time while each fsync takes 2 ms cost far fewer than N."""
    fsync = CountingFsync(delay_s=0.002)
    box, _ = await opened(tmp_path, fsync=fsync)
    before = fsync.num_calls
    rng = random.Random(0)
    num_appends = 200

    async def client(i: int) -> int:
        await asyncio.sleep(rng.uniform(0, 0.05))  # arrivals spread over 50 ms
        return await box.append(rec(i))

    seqs = await asyncio.gather(*(client(i) for i in range(num_appends)))
    num_fsyncs = fsync.num_calls - before
    assert len(set(seqs)) == num_appends
    assert num_fsyncs <= num_appends // 5, num_fsyncs
    await box.close()
    box, left = await opened(tmp_path)
    assert len(left) == num_appends
    await box.close()


async def test_the_file_is_compacted_when_most_lines_are_done(tmp_path: Path) -> None:
    box, _ = await opened(tmp_path, compact_min_lines=50)
    seqs = [await box.append(rec(i)) for i in range(40)]
    for seq in seqs[:35]:
        box.mark_done(seq)
    await box.append(rec(40))  # the done lines ride this append's group commit
    for _ in range(100):
        if box.num_compactions:
            break
        await asyncio.sleep(0.01)
    assert box.num_compactions == 1
    assert box.num_lines < 10 and len((tmp_path / FILE_NAME).read_bytes().splitlines()) == box.num_lines
    await box.close()
    box, left = await opened(tmp_path)
    assert [r.request_id for _, r in left] == [f"req-{i}" for i in range(35, 41)]
    await box.close()


async def test_a_second_opener_is_refused_while_the_first_holds_it(tmp_path: Path) -> None:
    first, _ = await opened(tmp_path)
    with pytest.raises(RuntimeError, match="in use by another process"):
        await Outbox(tmp_path).open()
    await first.close()
    second, _ = await opened(tmp_path)  # released on close
    await second.close()


async def test_lines_hold_the_record_fields_and_no_text(tmp_path: Path) -> None:
    box, _ = await opened(tmp_path)
    seq = await append_open(box, rec(1, output_tokens=0))
    box.checkpoint(seq, 5, T0)
    await box.append(rec(1), seq)
    await box.close()
    opening, ckpt, closing = (json.loads(line) for line in (tmp_path / FILE_NAME).read_text().splitlines())
    assert (set(opening), set(ckpt), set(closing)) == ({"seq", "open"}, {"seq", "ckpt"}, {"seq", "rec"})
    fields = {f.name for f in dataclasses.fields(UsageRecord)}
    assert set(opening["open"]) == set(closing["rec"]) == fields
    assert ckpt["ckpt"] == {"output_tokens": 5, "at": T0.isoformat()}


async def test_lines_of_an_older_gateway_without_the_newer_fields_still_replay(tmp_path: Path) -> None:
    """Lines written before the attempt, key, latency and class fields existed (an upgrade with records
    still pending): the records come back with those fields' defaults (interactive), and a new line keeps
    its latencies and its class."""
    old_fields = {"tenant_id": "acme", "model": "sluice-tiny", "model_version": "1", "prompt_tokens": 10,
                  "status": "finished", "started_at": T0.isoformat(),
                  "finished_at": (T0 + timedelta(1)).isoformat()}  # fmt: skip
    old_lines = [
        {"seq": 1, "rec": {**old_fields, "request_id": "req-1", "output_tokens": 1}},
        {"seq": 2, "open": {**old_fields, "request_id": "req-2", "output_tokens": 0}},
        {"seq": 2, "ckpt": {"output_tokens": 64, "at": T0.isoformat()}},
    ]
    (tmp_path / FILE_NAME).write_text("".join(json.dumps(line) + "\n" for line in old_lines))
    box, left = await opened(tmp_path)
    assert box.num_torn_lines == 0 and box.num_lost == 1
    lost = rec(2, output_tokens=64, status=Outcome.GATEWAY_LOST, finished_at=T0)
    assert left == [(1, rec(1)), (2, lost)]
    assert all(
        (r.attempt, r.idempotency_key, r.ttft_ms, r.itl_p95_ms, r.request_class)
        == (1, None, None, None, RequestClass.INTERACTIVE)
        for _, r in left
    )
    measured = rec(3, ttft_ms=12.5, itl_p95_ms=3.25)
    batch = rec(4, request_class=RequestClass.BATCH)
    await box.append(measured)
    await box.append(batch)
    await box.close()
    box, left = await opened(tmp_path)
    assert [r for _, r in left] == [rec(1), lost, measured, batch]
    await box.close()


async def test_a_request_left_open_is_pending_as_gateway_lost_with_its_last_ckpt(tmp_path: Path) -> None:
    box, _ = await opened(tmp_path)
    running = await append_open(box, rec(1, output_tokens=0))
    closed = await append_open(box, rec(2, output_tokens=0))
    discarded = await append_open(box, rec(3, output_tokens=0))
    unchecked = await append_open(box, rec(4, output_tokens=0, request_class=RequestClass.BATCH))
    for tokens in (64, 128, 150):
        box.checkpoint(running, tokens, T0 + timedelta(seconds=tokens))
    box.checkpoint(closed, 64, T0)
    assert await box.append(rec(2, output_tokens=99), closed) == closed  # closes it: not lost
    box.mark_done(discarded)  # ended with nothing to bill
    box.checkpoint(closed, 100, T0)  # a late checkpoint of a closed request changes nothing
    await box.close()
    box, left = await opened(tmp_path)
    assert box.num_lost == 2
    lost = rec(1, output_tokens=150, status=Outcome.GATEWAY_LOST, finished_at=T0 + timedelta(seconds=150))
    assert left == [
        (running, lost),
        (closed, rec(2, output_tokens=99)),
        (unchecked, rec(4, output_tokens=0, status=Outcome.GATEWAY_LOST, request_class=RequestClass.BATCH)),
    ]
    await box.close()
    box, again = await opened(tmp_path)  # billed once: now ordinary pending records
    assert again == left and box.num_lost == 0
    await box.close()


async def test_a_torn_checkpoint_leaves_the_previous_one(tmp_path: Path) -> None:
    box, _ = await opened(tmp_path)
    seq = await append_open(box, rec(1, output_tokens=0))
    box.checkpoint(seq, 64, T0)
    await box.close()
    with open(tmp_path / FILE_NAME, "ab") as f:
        f.write(b'{"seq":%d,"ckpt":{"output_tokens":128,"at":"2026-' % seq)
    _, left = await opened(tmp_path)
    assert [(r.output_tokens, r.status) for _, r in left] == [(64, Outcome.GATEWAY_LOST)]


async def test_compaction_keeps_open_requests_and_their_latest_checkpoint(tmp_path: Path) -> None:
    box, _ = await opened(tmp_path, compact_min_lines=50)
    running = await append_open(box, rec(0, output_tokens=0))
    for i in range(1, 40):  # many requests come and go while one long stream checkpoints
        seq = await box.append(rec(i))
        box.mark_done(seq)
        box.checkpoint(running, 64 * i, T0 + timedelta(seconds=i))
    await box.append(rec(40))  # queued lines ride this append's group commit
    for _ in range(100):
        if box.num_compactions:
            break
        await asyncio.sleep(0.01)
    assert box.num_compactions >= 1  # of 118 lines written, fewer than a third are left
    assert box.num_lines < 40 and len((tmp_path / FILE_NAME).read_bytes().splitlines()) == box.num_lines
    await box.close()  # the stream was still running
    _, left = await opened(tmp_path)
    lost = rec(0, output_tokens=64 * 39, status=Outcome.GATEWAY_LOST, finished_at=T0 + timedelta(seconds=39))
    assert [r for _, r in left] == [lost, rec(40)]


async def test_checkpoints_of_many_streams_share_fsyncs(tmp_path: Path) -> None:
    """Group commit: 50 streams checkpointing while each fsync takes 2 ms cost far fewer fsyncs than lines."""
    fsync = CountingFsync(delay_s=0.002)
    box, _ = await opened(tmp_path, fsync=fsync)
    seqs = await asyncio.gather(*(append_open(box, rec(i, output_tokens=0)) for i in range(50)))
    before = fsync.num_calls

    async def stream(seq: int) -> None:
        for n in range(1, 11):
            box.checkpoint(seq, 64 * n, T0)
            await asyncio.sleep(0.001)

    await asyncio.gather(*(stream(seq) for seq in seqs))
    await box.append(rec(99))  # after every checkpoint line
    assert fsync.num_calls - before <= 500 // 5, fsync.num_calls - before
    await box.close()
    _, left = await opened(tmp_path)
    assert sorted(r.output_tokens for _, r in left if r.status is Outcome.GATEWAY_LOST) == [640] * 50


async def test_checkpoints_arriving_one_at_a_time_wait_for_company(tmp_path: Path) -> None:
    """Unawaited lines trickling in (streams' checkpoints, one every few ms, each alone in the queue) share
    a write each lazy_flush_s rather than each paying a thread hand-off and an fsync; they reach the disk
    within about lazy_flush_s without anything awaited, and an awaited line takes them along at once."""
    fsync = CountingFsync()
    box, _ = await opened(tmp_path, fsync=fsync, lazy_flush_s=0.05)
    seqs = [await append_open(box, rec(i, output_tokens=0)) for i in range(3)]
    before = fsync.num_calls
    for n in range(1, 41):  # 40 checkpoints over ~0.2 s
        box.checkpoint(seqs[n % 3], n, T0)
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)
    assert 1 <= fsync.num_calls - before <= 10, fsync.num_calls - before
    assert sum(b'"ckpt"' in line for line in (tmp_path / FILE_NAME).read_bytes().splitlines()) == 40
    box.checkpoint(seqs[0], 100, T0)
    await box.append(rec(0, output_tokens=100), seqs[0])  # durable now, the checkpoint before it too
    assert b'"output_tokens":100,"at"' in (tmp_path / FILE_NAME).read_bytes()
    box.mark_done(seqs[0])
    await box.close()  # a line still waiting for company is written at close
    assert (tmp_path / FILE_NAME).read_bytes().endswith(b'{"seq":%d,"done":true}\n' % seqs[0])


def test_open_requests_and_their_checkpoints_survive_kill_9(tmp_path: Path) -> None:
    """A process opens a request, checkpoints it and is SIGKILLed: a new one bills it as gateway_lost."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_outbox import T0, append_open, rec
        from gateway.metering.outbox import Outbox

        async def main():
            box = Outbox(Path({str(tmp_path)!r}))
            await box.open()
            seq = await append_open(box, rec(1, output_tokens=0))
            box.checkpoint(seq, 64, T0)
            await box.append(rec(2))  # durable after the checkpoint: so is the checkpoint
            box.checkpoint(seq, 128, T0)  # queued, maybe never written
            print("durable", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == -9 and proc.stdout.strip() == "durable", proc.stderr

    async def reopen() -> list[tuple[str, int, Outcome]]:
        box, left = await opened(tmp_path)
        await box.close()
        return [(r.request_id, r.output_tokens, r.status) for _, r in left]

    left = asyncio.run(reopen())
    assert left[1] == ("req-2", 2, Outcome.FINISHED)
    assert left[0] in (("req-1", 64, Outcome.GATEWAY_LOST), ("req-1", 128, Outcome.GATEWAY_LOST))


def test_records_made_durable_survive_kill_9(tmp_path: Path) -> None:
    """A process appends, learns the records are durable, and is SIGKILLed: a new one finds them all."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_outbox import rec
        from gateway.metering.outbox import Outbox

        async def main():
            box = Outbox(Path({str(tmp_path)!r}))
            await box.open()
            seqs = await asyncio.gather(*(box.append(rec(i)) for i in range(20)))
            box.mark_done(seqs[0])  # queued, maybe never written: a replay would be harmless
            print("durable", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == -9 and proc.stdout.strip() == "durable", proc.stderr

    async def reopen() -> list[str]:
        box, left = await opened(tmp_path)  # the kernel released the dead process's lock
        await box.close()
        return [r.request_id for _, r in left]

    left = asyncio.run(reopen())
    assert left in ([f"req-{i}" for i in range(20)], [f"req-{i}" for i in range(1, 20)])
