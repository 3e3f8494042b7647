"""The production registry: PostgreSQL through a psycopg async connection pool, with LISTEN/NOTIFY.

Every write locks the generation row first and sends ``NOTIFY`` on ``channel`` in its own transaction
(``sluice.stores.registry.store``); one LISTEN connection per registry object wakes its waiters
(``sluice.stores.registry.feed``).
"""

from __future__ import annotations

from sluice.stores.registry.feed import PgListener, wait_for_generation
from sluice.stores.registry.store import DEFAULT_CHANNEL, SCHEMA, SqlRegistry


class PostgresRegistry(SqlRegistry):
    """``pool_acquire_timeout_s``: how long a call waits for a pooled connection before it raises
    ``RegistryUnavailable`` (during an outage). ``poll_interval_s``: how often waiters read the generation
    while the LISTEN connection is down; ``listen_check_interval_s``: while it is up (a guard against a
    notification lost silently); ``listen_retry_initial_s`` doubling to ``listen_retry_max_s``: how soon
    a lost LISTEN connection is retried."""

    def __init__(
        self,
        url: str,
        *,
        pool_max_size: int = 5,
        pool_acquire_timeout_s: float = 30.0,
        channel: str = DEFAULT_CHANNEL,
        poll_interval_s: float = 0.2,
        listen_check_interval_s: float = 5.0,
        listen_retry_initial_s: float = 0.5,
        listen_retry_max_s: float = 5.0,
    ) -> None:
        super().__init__(
            SCHEMA.postgres(url, pool_max_size=pool_max_size, acquire_timeout_s=pool_acquire_timeout_s),
            channel=channel,
        )
        self._poll_interval_s = poll_interval_s
        self._listen_check_interval_s = listen_check_interval_s
        self._listener = PgListener(
            url,
            channel,
            self._signal,
            retry_initial_s=listen_retry_initial_s,
            retry_max_s=listen_retry_max_s,
        )

    @property
    def is_listening(self) -> bool:
        """Whether changes arrive by NOTIFY now (else waiters poll)."""
        return self._listener.is_listening

    async def open(self, *, keep_trying: bool = False) -> None:
        """``keep_trying``: a server's start, see ``sluice.stores.db.MigratedPgPool``."""
        await self._db.open(keep_trying=keep_trying)
        self._listener.start()

    async def close(self) -> None:
        await self._listener.stop()
        await super().close()

    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        def poll_interval_s() -> float:
            listening = self._listener.is_listening
            return self._listen_check_interval_s if listening else self._poll_interval_s

        return await wait_for_generation(
            self.generation, self._signal, after_generation, timeout_s, poll_interval_s
        )
