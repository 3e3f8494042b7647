"""``sluice admin-tokens create|list|revoke``: the control plane's admin tokens, from the operator's side.

The bootstrap path: before any admin exists there is no one to call the admin API, so this talks to the
store directly, as ``sluice tenants`` does (``open_admin_token_store(get_settings())``: PostgreSQL when
``SLUICE_DATABASE_URL`` is set, else the SQLite file under ``SLUICE_STATE_DIR``). Each command runs once
in its own ``asyncio.run``. Output is a readable table, or JSON with ``--json``; a token is shown only
once, when it is made, and its hash never.

Exit codes: 0 done; 1 refused or failed (name taken, no such token, store unreachable); 2 usage (a bad
option, name or role).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from control_plane.table import render_table
from sluice.settings import Settings, SettingsError, get_settings
from sluice.stores.admin_tokens.base import (
    AdminToken,
    AdminTokenExistsError,
    AdminTokenStore,
    AdminTokenStoreUnavailable,
    UnknownAdminTokenError,
    token_prefix,
)
from sluice.stores.admin_tokens.roles import ROLES_BY_RANK, Role
from sluice.stores.db import describe_pg_url
from sluice.stores.openers import open_admin_token_store

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

HEADERS = ("NAME", "ROLE", "PREFIX", "STATUS", "CREATED", "LAST USED", "REVOKED")
TOKEN_SHOWN_ONCE = "This token is shown only now: store it safely (Sluice keeps only its hash)."

Command = Callable[[AdminTokenStore, argparse.Namespace], Awaitable[int]]


# ------------------------------------------------------------------------------------------ output


def _time(at: datetime | None, absent: str) -> str:
    """UTC to the second (``2026-12-01T16:29:15Z``): one cell, comparable with a log line."""
    return absent if at is None else at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _row(token: AdminToken) -> list[str]:
    return [
        token.name,
        str(token.role),
        token.token_prefix,
        "active" if token.active else "revoked",
        _time(token.created_at, "-"),
        _time(token.last_used_at, "never"),
        _time(token.revoked_at, "-"),
    ]


def token_json(token: AdminToken) -> dict[str, Any]:
    """The machine-readable token: ISO 8601 times, None for never."""

    def iso(at: datetime | None) -> str | None:
        return None if at is None else at.isoformat()

    return {
        "name": token.name,
        "role": str(token.role),
        "token_prefix": token.token_prefix,
        "active": token.active,
        "created_at": iso(token.created_at),
        "last_used_at": iso(token.last_used_at),
        "revoked_at": iso(token.revoked_at),
    }


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


# ---------------------------------------------------------------------------------------- commands


async def _create(store: AdminTokenStore, args: argparse.Namespace) -> int:
    token = await store.create(args.name, Role(args.role))
    if args.json:
        _print_json(
            {
                "name": args.name,
                "role": args.role,
                "token": token,
                "token_prefix": token_prefix(token),
                "note": TOKEN_SHOWN_ONCE,
            }
        )
        return EXIT_OK
    print(f"Created admin token {args.name!r} with role {args.role}.\n")
    print(f"Admin token: {token}\n{TOKEN_SHOWN_ONCE}")
    print("Send it as 'Authorization: Bearer <token>' to the control plane (SLUICE_CONTROL_PLANE_PORT).")
    return EXIT_OK


async def _list(store: AdminTokenStore, args: argparse.Namespace) -> int:
    tokens = await store.list()
    if args.json:
        _print_json([token_json(t) for t in tokens])
    elif not tokens:
        print("No admin tokens yet: add one with `sluice admin-tokens create NAME --role platform-admin`.")
    else:
        print(render_table(HEADERS, [_row(t) for t in tokens]))
    return EXIT_OK


async def _revoke(store: AdminTokenStore, args: argparse.Namespace) -> int:
    revoked = await store.revoke(args.name)
    if args.json:
        _print_json(token_json(revoked))
        return EXIT_OK
    print(f"Revoked admin token {revoked.name!r} ({revoked.role}): it is refused from now on.")
    return EXIT_OK


def _where(settings: Settings) -> str:
    if settings.database_url is not None:
        return f"PostgreSQL {describe_pg_url(settings.database_url)}"
    return f"SQLite {settings.sqlite_path}"


def _fail(message: str, exit_code: int) -> int:
    print(f"sluice: error: {' '.join(message.split())}", file=sys.stderr)
    return exit_code


def _handler(command: Command) -> Callable[[argparse.Namespace], int]:
    """The command, run in its own event loop against a freshly opened store; the store's refusals
    become one line on stderr and an exit code."""

    async def run(settings: Settings, args: argparse.Namespace) -> int:
        store = await open_admin_token_store(settings)
        try:
            return await command(store, args)
        finally:
            await store.close()

    def handle(args: argparse.Namespace) -> int:
        try:
            settings = get_settings()
        except SettingsError as exc:
            return _fail(str(exc), EXIT_USAGE)
        try:
            return asyncio.run(run(settings, args))
        except AdminTokenExistsError:
            return _fail(
                f"an active admin token is named {args.name!r} already (revoke it first with "
                f"`sluice admin-tokens revoke {args.name}`, or choose another name)",
                EXIT_FAILED,
            )
        except UnknownAdminTokenError:
            message = f"no active admin token is named {args.name!r} (see `sluice admin-tokens list`)"
            return _fail(message, EXIT_FAILED)
        except AdminTokenStoreUnavailable as exc:
            return _fail(f"cannot reach the admin token store at {_where(settings)}: {exc}", EXIT_FAILED)
        except ValueError as exc:  # the store's validation: a bad name given on the command line
            return _fail(str(exc), EXIT_USAGE)

    return handle


# ---------------------------------------------------------------------------------------- parsers


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``create``, ``list`` and ``revoke`` under ``parser`` (``sluice admin-tokens``)."""
    sub = parser.add_subparsers(dest="admin_tokens_command", metavar="COMMAND", required=True)
    roles = [str(role) for role in ROLES_BY_RANK]

    create = sub.add_parser("create", help="make an admin token and print it (the only time it is shown)")
    create.add_argument(
        "name", metavar="NAME", help="who or what holds it: a-z 0-9 . _ @ -, unique if active"
    )
    create.add_argument(
        "--role",
        required=True,
        choices=roles,
        help="viewer reads; release-manager also changes releases; platform-admin also manages admin tokens",
    )
    create.add_argument("--json", action="store_true", help="print JSON instead of text")
    create.set_defaults(handler=_handler(_create))

    list_ = sub.add_parser("list", help="every admin token, active and revoked (never the token itself)")
    list_.add_argument("--json", action="store_true", help="print JSON instead of a table")
    list_.set_defaults(handler=_handler(_list))

    revoke = sub.add_parser("revoke", help="stop the active token with this name working, at once")
    revoke.add_argument("name", metavar="NAME")
    revoke.add_argument("--json", action="store_true", help="print JSON instead of text")
    revoke.set_defaults(handler=_handler(_revoke))
