"""The Redis stream sink: the fleet's records in one stream that every gateway appends to and any number
of consumers read (``XREAD``, ``XRANGE``, consumer groups), bounded so it cannot fill Redis.

Each record is one entry ``XADD <key> MAXLEN ~ <maxlen> * record <json>``: a single field ``record``
holding the same JSON object as a file line (types kept: numbers, nulls, lists), so a consumer decodes
one field and reads the record's ``schema``. ``MAXLEN ~`` trims whole stream nodes: the stream keeps at
least ``maxlen`` entries and at most about 100 more (Redis's ``stream-node-max-entries``).

Redis down or refusing: the batch is dropped and counted, the request path never waits (it only
queues), and for ``retry_interval_s`` after a failure records are dropped without trying, so a dead
Redis is not hammered; the next batch after that reconnects. No retries: an ``XADD`` that may have
landed is never sent twice (records are at most once).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gateway.telemetry.sink import QueuedSink

RECORD_FIELD = "record"


class RedisUnavailableError(ConnectionError):
    """Redis failed less than ``retry_interval_s`` ago: the batch is dropped without trying."""


class RedisStreamSink(QueuedSink):
    """Appends records to the stream ``key`` at ``url`` from the sink's thread, one pipeline per batch."""

    name = "redis"

    def __init__(
        self,
        url: str,
        key: str,
        *,
        maxlen: int,
        max_queued: int = 10_000,
        on_drop: Callable[[int], None] | None = None,
        timeout_s: float = 2.0,
        retry_interval_s: float = 1.0,
    ) -> None:
        super().__init__(max_queued=max_queued, on_drop=on_drop)
        self._key = key
        self._maxlen = maxlen
        self._retry_interval_s = retry_interval_s
        self._retry_at_s = 0.0  # time.monotonic() before which a failed Redis is not tried again
        # Connects on the first batch (a gateway starts whether Redis is up or not).
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
        self._start()

    def _send(self, lines: list[str]) -> int:
        if time.monotonic() < self._retry_at_s:
            raise RedisUnavailableError("Redis failed less than the retry interval ago")
        pipe = self._client.pipeline(transaction=False)
        for line in lines:
            pipe.xadd(self._key, {RECORD_FIELD: line}, maxlen=self._maxlen, approximate=True)
        try:
            # An error reply (e.g. OOM) refuses its entry only; a lost connection raises for the batch.
            replies = pipe.execute(raise_on_error=False)
        except redis.exceptions.RedisError:
            self._retry_at_s = time.monotonic() + self._retry_interval_s
            raise
        return sum(isinstance(reply, Exception) for reply in replies)

    def _shut(self) -> None:
        self._client.close()
