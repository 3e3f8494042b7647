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

from sluice.domain import Outcome, UsageRecord
from sluice.metering.outbox import FILE_NAME, Outbox

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
    await box.append(rec(1))
    await box.close()
    (line,) = (tmp_path / FILE_NAME).read_text().splitlines()
    obj = json.loads(line)
    assert set(obj) == {"seq", "rec"}
    assert set(obj["rec"]) == {f.name for f in dataclasses.fields(UsageRecord)}


def test_records_made_durable_survive_kill_9(tmp_path: Path) -> None:
    """A process appends, learns the records are durable, and is SIGKILLed: a new one finds them all."""
    script = textwrap.dedent(
        f"""
        import asyncio, os, signal, sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_outbox import rec
        from sluice.metering.outbox import Outbox

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
