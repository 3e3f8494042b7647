"""The change feed: how ``wait_for_change`` learns that the generation moved.

Waiters re-read the generation from the database whenever they are woken, and at the latest every poll
interval. What wakes them: a write through the same registry object (both backends); on PostgreSQL a
NOTIFY, sent by every write in its own transaction (so it is delivered on commit, never for a change
that rolled back), and received by one LISTEN connection per registry object (``PgListener``). While that
connection is lost the poll interval is short (polling as fallback); while it is up, a long one only
guards against a notification lost without the connection failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable

import psycopg
from psycopg import sql

from sluice.stores.db import PG_UNREACHABLE, describe_pg_url
from sluice.stores.registry.base import InvalidChange

log = logging.getLogger(__name__)

LISTEN_APPLICATION_NAME = "sluice-registry-listen"  # how its connection shows in pg_stat_activity


class ChangeSignal:
    """Wakes every current waiter at once. A waiter takes ``current()`` before it reads the generation, so
    a wake between its read and its wait is not lost."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()


async def wait_for_generation(
    read_generation: Callable[[], Awaitable[int]],
    signal: ChangeSignal,
    after_generation: int,
    timeout_s: float,
    poll_interval_s: Callable[[], float],
) -> int:
    """``Registry.wait_for_change``: ``poll_interval_s()`` is asked before each wait (it changes when a
    listen connection is lost or regained)."""
    if isinstance(after_generation, bool) or not isinstance(after_generation, int) or after_generation < 0:
        raise InvalidChange(f"after_generation must be a whole number >= 0, got {after_generation!r}")
    if not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s) or timeout_s < 0:
        raise InvalidChange(f"timeout_s must be a finite number >= 0, got {timeout_s!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        woken = signal.current()
        generation = await read_generation()
        remaining_s = deadline - loop.time()
        if generation > after_generation or remaining_s <= 0:
            return generation
        with contextlib.suppress(TimeoutError):  # a timeout is a poll: read the generation again
            await asyncio.wait_for(woken.wait(), min(remaining_s, poll_interval_s()))


class PgListener:
    """One connection that LISTENs on ``channel`` and wakes ``signal`` on every notification, and once more
    each time it (re)connects (changes made while it was away were not notified). A lost connection is
    retried in the background, ``retry_initial_s`` doubling to ``retry_max_s``; ``is_listening`` says
    whether it is up now."""

    def __init__(
        self,
        url: str,
        channel: str,
        signal: ChangeSignal,
        *,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
    ) -> None:
        self._url = url
        self._channel = channel
        self._signal = signal
        self._retry_initial_s = retry_initial_s
        self._retry_max_s = retry_max_s
        self._task: asyncio.Task[None] | None = None
        self._listening = False

    @property
    def is_listening(self) -> bool:
        return self._listening

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="registry-listen")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._listening = False

    async def _run(self) -> None:
        delay_s = self._retry_initial_s
        while True:
            try:
                await self._listen()
            except PG_UNREACHABLE as exc:
                # NOTE: a debug line: an outage is the registry store's pool to report, once each way
                # (sluice.outages); meanwhile waiters poll, so nothing waits on this connection.
                log.debug(
                    "registry: LISTEN connection to %s lost or refused (%s); polling until it is back",
                    describe_pg_url(self._url),
                    " ".join(str(exc).split())[:200],
                )
            except Exception:
                log.exception("registry: LISTEN connection failed for a reason other than reachability")
            if self._listening:  # it was up: a fresh outage starts the backoff again
                delay_s = self._retry_initial_s
                self._listening = False
                # NOTE: waiters sleep up to the listening check interval (seconds): woken now, they
                # read the generation and go on polling, so a change is not waited for past that
                self._signal.notify()
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, self._retry_max_s)

    async def _listen(self) -> None:
        conn = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, application_name=LISTEN_APPLICATION_NAME, connect_timeout=5
        )
        async with conn:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
            self._listening = True
            self._signal.notify()
            async for _ in conn.notifies():
                self._signal.notify()
