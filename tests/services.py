"""What a test does when a server it needs (PostgreSQL, Redis) cannot be reached: it skips, saying why,
on a developer's machine; with ``CI=true`` in the environment it fails, so a green CI run has really
tested the PostgreSQL and Redis backends.

``pg.created_database`` and ``redis_run.unreachable_reason`` fail at once under ``CI=true``, so every test
that reaches a server through them fails rather than skips, whatever it does with the answer."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def services_required() -> bool:
    """True when this run must have every server (``CI`` set to true, 1 or yes, as CI systems set it)."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def fail_if_required(reason: str) -> None:
    """Fail the current test (or fixture) for ``reason`` when ``services_required()``; else return."""
    if services_required():
        pytest.fail(f"{reason} (CI=true: a server the tests need must be up)", pytrace=False)


def service_missing(reason: str) -> NoReturn:
    """Skip the current test for ``reason``, or fail it when ``services_required()``."""
    fail_if_required(reason)
    pytest.skip(reason)
