"""The telemetry sinks besides the file (test_telemetry.py): stdout lines, the Redis stream (one ``record``
field per entry, trimmed to its bound, records dropped and counted while Redis is down and delivered again
once it is back, ``write`` never waiting), the fan-out (a stuck sink costs only its own records), and the
sinks built from settings with drops counted by sink name."""

from __future__ import annotations

import io
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import pytest
import redis
from harness import wait_until
from redis_run import REDIS_URL, RUN_PREFIX, unreachable_reason
from services import service_missing
from tcp_proxy import ProxyThread
from test_telemetry import _record

from gateway.telemetry import (
    FileSink,
    RedisStreamSink,
    StdoutSink,
    TelemetryWriter,
    open_telemetry,
    record_json,
)
from gateway.telemetry.redis_stream import RECORD_FIELD
from sluice.settings import SettingsError, load_settings


@pytest.fixture(scope="module")
def redis_client() -> Iterator[redis.Redis]:
    reason = unreachable_reason()
    if reason is not None:
        service_missing(reason)
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    yield client
    keys = list(client.scan_iter(match=f"{RUN_PREFIX}telemetry-*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def stream_key(redis_client: redis.Redis) -> str:
    return f"{RUN_PREFIX}telemetry-{uuid.uuid4().hex[:8]}"


Entries = list[tuple[bytes, dict[bytes, bytes]]]  # what XRANGE answers (redis-py types it loosely)


def _stream_ids(client: redis.Redis, key: str) -> list[str]:
    entries = cast(Entries, client.xrange(key))
    return [json.loads(fields[RECORD_FIELD.encode()])["request_id"] for _, fields in entries]


def test_stdout_gets_one_json_line_per_record(capsys: pytest.CaptureFixture[str]) -> None:
    sink = StdoutSink()  # sys.stdout as the test captures it
    for i in range(3):
        sink.write(_record(i))
    sink.close()
    lines = capsys.readouterr().out.splitlines()
    assert lines == [record_json(_record(i)) for i in range(3)]
    assert json.loads(lines[0])["schema"] == 2 and sink.num_dropped == 0


def test_each_entry_is_one_record_field_and_the_stream_keeps_about_its_bound(
    redis_client: redis.Redis, stream_key: str
) -> None:
    maxlen = 1_000
    sink = RedisStreamSink(REDIS_URL, stream_key, maxlen=maxlen)
    for i in range(2_500):
        sink.write(_record(i))
    sink.close()
    assert sink.num_dropped == 0
    [(_, fields)] = cast(Entries, redis_client.xrevrange(stream_key, count=1))
    assert fields == {RECORD_FIELD.encode(): record_json(_record(2_499)).encode()}
    ids = _stream_ids(redis_client, stream_key)
    # MAXLEN ~ trims whole nodes of 100 entries: at least the bound is kept, never a node more.
    assert maxlen <= len(ids) <= maxlen + 100
    assert ids == [f"req-{i:05d}" for i in range(2_500 - len(ids), 2_500)]  # the newest, in order


def test_while_redis_is_down_records_are_dropped_and_counted_and_it_reconnects(
    redis_client: redis.Redis, stream_key: str
) -> None:
    url = urlsplit(REDIS_URL)
    proxy = ProxyThread(url.hostname or "127.0.0.1", url.port or 6379)
    drops: list[int] = []
    sink = RedisStreamSink(
        f"redis://127.0.0.1:{proxy.port}/0",
        stream_key,
        maxlen=1_000,
        on_drop=drops.append,
        timeout_s=1.0,
        retry_interval_s=0.05,
    )
    try:
        sink.write(_record(0))
        assert sink.flush() and _stream_ids(redis_client, stream_key) == ["req-00000"]
        proxy.cut()  # the connection is reset, new ones are refused
        started_s = time.monotonic()
        for i in range(1, 21):
            sink.write(_record(i))
        assert time.monotonic() - started_s < 0.1  # the caller never waits for Redis
        assert sink.flush()
        assert sink.num_dropped == sum(drops) == 20
        proxy.restore()
        tries = iter(range(100, 200))

        def delivered() -> bool:
            sink.write(_record(next(tries)))  # dropped until the retry interval passed and it reconnects
            sink.flush()
            return len(_stream_ids(redis_client, stream_key)) > 1

        wait_until(delivered, 5.0, "a record through the restored Redis")
        num_dropped = sink.num_dropped
        for i in range(300, 305):
            sink.write(_record(i))
        assert sink.flush() and sink.num_dropped == num_dropped
        assert _stream_ids(redis_client, stream_key)[-5:] == [f"req-{i:05d}" for i in range(300, 305)]
    finally:
        sink.close()
        proxy.close()


def test_the_fan_out_sends_every_record_to_every_sink_and_a_stuck_one_costs_only_its_own(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "stuck.jsonl"
    os.mkfifo(fifo)  # opening it for writing blocks until a reader comes: that sink is stuck
    stuck = FileSink(fifo, max_queued=5)
    out = io.StringIO()
    good = FileSink(tmp_path / "telemetry.jsonl")
    writer = TelemetryWriter([stuck, StdoutSink(out), good])
    for i in range(20):
        writer.write(_record(i))
    assert writer.sinks[1].flush() and good.flush()
    expected = [record_json(_record(i)) for i in range(20)]
    assert out.getvalue().splitlines() == expected
    assert (tmp_path / "telemetry.jsonl").read_text().splitlines() == expected
    assert stuck.num_dropped == 15 and good.num_dropped == 0
    reader = threading.Thread(target=fifo.read_text)
    reader.start()  # unsticks it, so it can close
    writer.close()
    reader.join(10)


def test_settings_name_the_sinks_and_drops_are_counted_by_sink(tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path,
        telemetry_sinks="redis, stdout,file",
        redis_url="redis://127.0.0.1:1/0",  # never reached: nothing is written before the close
        telemetry_redis_stream=f"{RUN_PREFIX}telemetry-unused",
    )
    drops: list[tuple[str, int]] = []
    writer = open_telemetry(settings, on_drop=lambda sink, n: drops.append((sink, n)))
    assert [type(s) for s in writer.sinks] == [RedisStreamSink, StdoutSink, FileSink]
    writer.close()
    writer.write(_record(0))  # after the close: dropped by each, counted under its name
    assert drops == [("redis", 1), ("stdout", 1), ("file", 1)]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"telemetry_sinks": "redis"}, "redis_url is unset"),
        ({"telemetry_sinks": "file,kafka"}, "comma list of distinct sinks among file, stdout, redis"),
        ({"telemetry_sinks": "file,file"}, "comma list of distinct sinks"),
        ({"telemetry_redis_maxlen": 10}, "SLUICE_TELEMETRY_REDIS_MAXLEN"),
    ],
)
def test_settings_refuse_a_sink_they_cannot_build(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(**overrides)
