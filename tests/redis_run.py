"""The Redis server tests use (``TEST_REDIS_URL``, default the local one), and the key prefix of this test
run: every key a test writes starts with ``RUN_PREFIX``, and only those are deleted (never FLUSHDB: the
server is shared). ``tests/core/conftest.py`` has the ``redis_up`` fixture that cleans up. A test that
needs Redis skips if it is down, or fails with ``CI=true`` (``services.service_missing``)."""

from __future__ import annotations

import os
import uuid

import redis
from services import fail_if_required, service_missing

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RUN_PREFIX = f"sluice-test-{uuid.uuid4().hex}:"


def unreachable_reason() -> str | None:
    """None if Redis answers, else why not (a test failure instead with ``CI=true``)."""
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as exc:
        reason = f"Redis at {REDIS_URL} unreachable: {exc}"
        fail_if_required(reason)
        return reason
    finally:
        client.close()
    return None


def delete_run_keys() -> None:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"{RUN_PREFIX}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def need_redis(redis_up: str | None) -> None:
    if redis_up is not None:
        service_missing(redis_up)
