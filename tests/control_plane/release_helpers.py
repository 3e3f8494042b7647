"""What the release tests share (test_release_api.py, test_rollout_guard.py, test_cli_releases.py): admin
tokens per role, the error shape, a model with a stable and a canary version, and usage rows written
straight into the ledger the service reads."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from sluice.domain import Outcome, UsageRecord
from sluice.settings import Settings
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.admin_tokens.store import SqliteAdminTokenStore
from sluice.stores.ledger.store import SqliteLedger

DIGEST = "sha256:" + "ab" * 32
_request_ids = itertools.count()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_of(resp: httpx.Response) -> dict[str, Any]:
    """The OpenAI-style error body, checked for its shape."""
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error: dict[str, Any] = body["error"]
    return error


def make_tokens(settings: Settings) -> dict[Role, str]:
    """One token per role (named after it), in the service's SQLite file."""

    async def run() -> dict[Role, str]:
        store = SqliteAdminTokenStore(settings.sqlite_path)
        await store.open()
        try:
            return {role: await store.create(str(role), role) for role in Role}
        finally:
            await store.close()

    return asyncio.run(run())


def usage_rows(
    model: str,
    version: str,
    *,
    num_ok: int,
    num_failed: int = 0,
    ttft_ms: float = 100.0,
    itl_p95_ms: float = 20.0,
    finished_at: datetime | None = None,
) -> list[UsageRecord]:
    """Rows as the gateway writes them for ``version``: ``num_ok`` successes and ``num_failed`` failures,
    each with ``ttft_ms`` and ``itl_p95_ms``."""
    finished_at = finished_at or datetime.now(UTC)
    outcomes = [Outcome.FINISHED] * num_ok + [Outcome.FAILED] * num_failed
    return [
        UsageRecord(
            tenant_id="acme",
            request_id=f"req-{next(_request_ids)}",
            model=model,
            model_version=version,
            prompt_tokens=10,
            output_tokens=5,
            status=outcome,
            started_at=finished_at - timedelta(seconds=1),
            finished_at=finished_at,
            ttft_ms=ttft_ms,
            itl_p95_ms=itl_p95_ms,
        )
        for outcome in outcomes
    ]


def write_usage(settings: Settings, rows: list[UsageRecord]) -> None:
    """``rows`` into the ledger the service reads (its SQLite file), as a gateway would."""

    async def run() -> None:
        ledger = SqliteLedger(settings.sqlite_path)
        await ledger.open()
        try:
            for row in rows:
                assert await ledger.record(row)
        finally:
            await ledger.close()

    asyncio.run(run())
