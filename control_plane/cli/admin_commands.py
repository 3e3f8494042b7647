"""What the release command groups (``sluice models|versions|routes|rollout``) share: each command is one
or two admin API calls (``AdminApi``), printed as a readable table or, with ``--json``, as the API's own
JSON. Exit codes: 0 done; 1 the service refused or failed, or could not be reached (its message on
stderr, one line); 2 usage (argparse, or a value checked here before any call).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from control_plane.cli.admin_client import AdminApi, AdminApiError, add_connection_options
from sluice.settings import SettingsError, load_settings

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

Command = Callable[[AdminApi, argparse.Namespace], int]


class UsageError(Exception):
    """A value the command refuses before calling the service (exit 2)."""


def fail(message: str, exit_code: int) -> int:
    print(f"sluice: error: {' '.join(message.split())}", file=sys.stderr)
    return exit_code


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def admin_command(command: Command) -> Callable[[argparse.Namespace], int]:
    """``command`` with the admin API from ``--admin-url``/``--token`` (else settings); the service's
    refusals and an unreachable service become one line on stderr and exit 1."""

    def handle(args: argparse.Namespace) -> int:
        try:
            api = AdminApi.from_args(args, load_settings())
        except SettingsError as exc:
            return fail(str(exc), EXIT_USAGE)
        try:
            return command(api, args)
        except UsageError as exc:
            return fail(str(exc), EXIT_USAGE)
        except AdminApiError as exc:
            return fail(str(exc), EXIT_FAILED)

    return handle


def add_options(parser: argparse.ArgumentParser, command: Command) -> None:
    """``--json``, the connection options, and the handler."""
    parser.add_argument("--json", action="store_true", help="print the admin API's JSON instead of text")
    add_connection_options(parser)
    parser.set_defaults(handler=admin_command(command))


def model_path(model: str) -> str:
    """A model name as one path segment (``/`` sent as ``%2F``: model names may hold it)."""
    return quote(model, safe="")


def print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def when(iso: str | None, absent: str = "-") -> str:
    """An API time as one cell: UTC to the second (``2026-12-01T16:29:15Z``)."""
    if iso is None:
        return absent
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pct(basis_points: int) -> str:
    """Basis points as a percentage without noise: 10000 -> ``100%``, 150 -> ``1.5%``."""
    return f"{basis_points / 100:g}%"


def route_text(route: list[dict[str, Any]] | None) -> str:
    """``v1 90%, v2 10%``; ``-`` when the model is not routed."""
    if not route:
        return "-"
    return ", ".join(f"{e['version']} {pct(e['weight_bp'])}" for e in route)
