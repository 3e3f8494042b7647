"""``sluice tenants create|list|set|rotate-key``: the tenant store, from the operator's side.

Each command opens the store the gateway uses (``open_tenant_store(get_settings())``: PostgreSQL when
``SLUICE_DATABASE_URL`` is set, else the SQLite file under ``SLUICE_STATE_DIR``), runs once in its own
``asyncio.run``, and closes it. Output is a readable table, or JSON with ``--json``; a key hash is never
shown, and a key only once, when it is made.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from control_plane.table import render_table
from sluice.domain import ALL_CLASSES, RequestClass, Tenant
from sluice.safety.config import load_safety_config, policy_names
from sluice.settings import Settings, SettingsError, get_settings
from sluice.stores.db import describe_pg_url
from sluice.stores.openers import open_tenant_store
from sluice.stores.tenants.base import (
    MUTABLE_FIELDS,
    TenantExistsError,
    TenantStore,
    TenantStoreUnavailable,
    UnknownTenantError,
    apply_changes,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

# What a new tenant gets unless told otherwise (the store's own defaults are unlimited).
NEW_TENANT_TOKENS_PER_MINUTE = 100_000
NEW_TENANT_MAX_CONCURRENT_REQUESTS = 16

HEADERS = ("ID", "NAME", "WEIGHT", "TOKENS/MIN", "CONCURRENT", "MODELS", "CLASSES", "SAFETY", "KEYS")
KEY_SHOWN_ONCE = "This key is shown only now: store it safely (Sluice keeps only its hash)."

Command = Callable[[TenantStore, argparse.Namespace, Settings], Awaitable[int]]


# ---------------------------------------------------------------------------------------- values


def _limit(text: str) -> int | None:
    if text.strip().lower() == "unlimited":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'unlimited', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 or 'unlimited', got {value}")
    return value


def _weight(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1000], got {text!r}") from None


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _models(text: str) -> frozenset[str]:
    names = _names(text)
    if not names:
        raise argparse.ArgumentTypeError("give model names separated by commas, or 'all'")
    return frozenset() if names == ["all"] else frozenset(names)


def _classes(text: str) -> frozenset[RequestClass]:
    names = _names(text)
    valid = ", ".join(sorted(ALL_CLASSES))
    if not names:
        raise argparse.ArgumentTypeError(f"give classes separated by commas ({valid}), or 'all'")
    if names == ["all"]:
        return ALL_CLASSES
    unknown = [n for n in names if n not in ALL_CLASSES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown class {unknown[0]!r}; valid: {valid}, or 'all'")
    return frozenset(RequestClass(n) for n in names)


# ------------------------------------------------------------------------------------------ output


def _show_limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def _row(tenant: Tenant, num_keys: int) -> list[str]:
    return [
        tenant.tenant_id,
        tenant.name,
        f"{tenant.weight:g}",
        _show_limit(tenant.tokens_per_minute),
        _show_limit(tenant.max_concurrent_requests),
        ",".join(sorted(tenant.allowed_models)) or "all",
        ",".join(sorted(tenant.allowed_classes)),
        tenant.safety_policy,
        str(num_keys),
    ]


def tenant_json(tenant: Tenant, num_keys: int) -> dict[str, Any]:
    """The machine-readable tenant: None for unlimited, [] for every model."""
    return {
        "tenant_id": tenant.tenant_id,
        "name": tenant.name,
        "weight": tenant.weight,
        "tokens_per_minute": tenant.tokens_per_minute,
        "max_concurrent_requests": tenant.max_concurrent_requests,
        "allowed_models": sorted(tenant.allowed_models),
        "allowed_classes": sorted(tenant.allowed_classes),
        "safety_policy": tenant.safety_policy,
        "num_active_keys": num_keys,
    }


def _print_json(value: object) -> None:
    print(json.dumps(value, indent=2))


def _propagation(settings: Settings) -> str:
    return f"Gateways pick this up within SLUICE_TENANT_CACHE_TTL_S ({settings.tenant_cache_ttl_s:g} s here)."


# ---------------------------------------------------------------------------------------- commands


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    """The tenant fields given on the command line (options not given are absent: SUPPRESS)."""
    return {field: getattr(args, field) for field in sorted(MUTABLE_FIELDS) if hasattr(args, field)}


def _check_safety_policy(changes: dict[str, Any], settings: Settings) -> None:
    """A policy name must be one the gateways know: built in, or in their SLUICE_SAFETY_CONFIG."""
    name = changes.get("safety_policy")
    if name is None:
        return
    known = policy_names(load_safety_config(settings.safety_config_path))
    if name not in known:
        raise ValueError(f"unknown safety policy {name!r}; known: {', '.join(known)}")


async def _create(store: TenantStore, args: argparse.Namespace, settings: Settings) -> int:
    new = Tenant(
        tenant_id=args.tenant_id,
        name=args.name,
        tokens_per_minute=NEW_TENANT_TOKENS_PER_MINUTE,
        max_concurrent_requests=NEW_TENANT_MAX_CONCURRENT_REQUESTS,
    )
    _check_safety_policy(_changes(args), settings)
    tenant = apply_changes(new, _changes(args))
    api_key = await store.create(tenant)
    if args.json:
        _print_json({"tenant": tenant_json(tenant, 1), "api_key": api_key, "note": KEY_SHOWN_ONCE})
        return EXIT_OK
    print(f"Created tenant {tenant.tenant_id}.\n")
    print(render_table(HEADERS, [_row(tenant, 1)]))
    print(f"\nAPI key: {api_key}\n{KEY_SHOWN_ONCE}")
    return EXIT_OK


async def _list(store: TenantStore, args: argparse.Namespace, settings: Settings) -> int:
    tenants = await store.list()
    num_keys = [await store.num_active_keys(t.tenant_id) for t in tenants]
    if args.json:
        _print_json([tenant_json(t, n) for t, n in zip(tenants, num_keys, strict=True)])
    elif not tenants:
        print("No tenants yet: add one with `sluice tenants create ID --name NAME`.")
    else:
        print(render_table(HEADERS, [_row(t, n) for t, n in zip(tenants, num_keys, strict=True)]))
    return EXIT_OK


async def _set(store: TenantStore, args: argparse.Namespace, settings: Settings) -> int:
    _check_safety_policy(_changes(args), settings)
    tenant = await store.update(args.tenant_id, **_changes(args))
    num_keys = await store.num_active_keys(tenant.tenant_id)
    if args.json:
        _print_json(tenant_json(tenant, num_keys))
        return EXIT_OK
    print(f"Updated tenant {tenant.tenant_id}.\n")
    print(render_table(HEADERS, [_row(tenant, num_keys)]))
    print(f"\n{_propagation(settings)}")
    return EXIT_OK


async def _rotate_key(store: TenantStore, args: argparse.Namespace, settings: Settings) -> int:
    num_before = await store.num_active_keys(args.tenant_id)
    api_key = await store.rotate_key(args.tenant_id, revoke_old=not args.keep_old)
    num_revoked = 0 if args.keep_old else num_before
    num_active = await store.num_active_keys(args.tenant_id)
    if args.json:
        _print_json(
            {
                "tenant_id": args.tenant_id,
                "api_key": api_key,
                "num_revoked_keys": num_revoked,
                "num_active_keys": num_active,
                "tenant_cache_ttl_s": settings.tenant_cache_ttl_s,
                "note": KEY_SHOWN_ONCE,
            }
        )
        return EXIT_OK
    print(f"New API key for {args.tenant_id}: {api_key}\n{KEY_SHOWN_ONCE}")
    if args.keep_old:
        print(f"Kept the {num_before} previous key(s) active ({num_active} active now).")
    else:
        print(f"Revoked {num_revoked} previous key(s); only the new key is active.")
    print(_propagation(settings))
    return EXIT_OK


class StoreUnavailableError(Exception):
    pass


def _where(settings: Settings) -> str:
    if settings.database_url is not None:
        return f"PostgreSQL {describe_pg_url(settings.database_url)}"
    return f"SQLite {settings.sqlite_path}"


def _fail(message: str, exit_code: int) -> int:
    print(f"sluice: error: {message}", file=sys.stderr)
    return exit_code


def _handler(command: Command) -> Callable[[argparse.Namespace], int]:
    """The command, run in its own event loop against a freshly opened store; the store's refusals
    become one line on stderr and an exit code."""

    async def run(settings: Settings, args: argparse.Namespace) -> int:
        try:
            store = await open_tenant_store(settings)
        except TenantStoreUnavailable as exc:  # every backend's way of failing to open
            raise StoreUnavailableError(f"cannot open the tenant store at {_where(settings)}: {exc}") from exc
        try:
            return await command(store, args, settings)
        finally:
            await store.close()

    def handle(args: argparse.Namespace) -> int:
        try:
            return asyncio.run(run(get_settings(), args))
        except UnknownTenantError as exc:
            return _fail(f"no tenant {exc.args[0]!r} (see `sluice tenants list`)", EXIT_FAILED)
        except TenantExistsError as exc:
            return _fail(
                f"tenant {exc.args[0]!r} already exists (change it with `sluice tenants set`)", EXIT_FAILED
            )
        except StoreUnavailableError as exc:
            return _fail(" ".join(str(exc).split()), EXIT_FAILED)
        except TenantStoreUnavailable as exc:  # opened, then lost in the middle of the command
            return _fail(f"the tenant store stopped answering: {' '.join(str(exc).split())}", EXIT_FAILED)
        except SettingsError as exc:
            return _fail(" ".join(str(exc).split()), EXIT_USAGE)
        except ValueError as exc:  # the store's validation: a bad value given on the command line
            return _fail(str(exc), EXIT_USAGE)

    return handle


# ---------------------------------------------------------------------------------------- parsers


def _add_tenant_options(parser: argparse.ArgumentParser, *, creating: bool) -> None:
    """The field options; not given means absent from the namespace (SUPPRESS), never None, since
    None is a value here ('unlimited')."""

    def new(default: object) -> str:
        return f" (default: {default})" if creating else ""

    s = argparse.SUPPRESS
    if not creating:
        parser.add_argument("--name", default=s, help="display name")
    parser.add_argument(
        "--weight", type=_weight, default=s, help="share under contention, (0, 1000]" + new(1)
    )
    parser.add_argument(
        "--tokens-per-minute",
        dest="tokens_per_minute",
        type=_limit,
        default=s,
        metavar="N|unlimited",
        help="prompt + output tokens per minute" + new(NEW_TENANT_TOKENS_PER_MINUTE),
    )
    parser.add_argument(
        "--max-concurrent",
        dest="max_concurrent_requests",
        type=_limit,
        default=s,
        metavar="N|unlimited",
        help="requests in flight at once" + new(NEW_TENANT_MAX_CONCURRENT_REQUESTS),
    )
    parser.add_argument(
        "--models",
        dest="allowed_models",
        type=_models,
        default=s,
        metavar="a,b|all",
        help="models it may call" + new("all"),
    )
    parser.add_argument(
        "--classes",
        dest="allowed_classes",
        type=_classes,
        default=s,
        metavar="interactive,batch|all",
        help="request classes it may use" + new("both"),
    )
    parser.add_argument(
        "--safety-policy",
        dest="safety_policy",
        default=s,
        metavar="NAME",
        help="safety filters on its prompts and output: none, default, pii, strict, or one from "
        "SLUICE_SAFETY_CONFIG" + new("default"),
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``create``, ``list``, ``set`` and ``rotate-key`` under ``parser`` (``sluice tenants``)."""
    sub = parser.add_subparsers(dest="tenants_command", metavar="COMMAND", required=True)

    create = sub.add_parser("create", help="add a tenant and print its first API key")
    create.add_argument("tenant_id", metavar="ID", help="lower-case letters, digits, '-' and '_'")
    create.add_argument("--name", required=True, help="display name")
    _add_tenant_options(create, creating=True)
    create.set_defaults(handler=_handler(_create))

    list_ = sub.add_parser("list", help="every tenant, its limits and its number of active keys")
    list_.add_argument("--json", action="store_true", help="print JSON instead of a table")
    list_.set_defaults(handler=_handler(_list))

    set_ = sub.add_parser("set", help="change only the given fields of a tenant")
    set_.add_argument("tenant_id", metavar="ID")
    _add_tenant_options(set_, creating=False)
    run_set = _handler(_set)

    def check_set(args: argparse.Namespace) -> int:
        if not _changes(args):
            options = "--name, --weight, --tokens-per-minute, --max-concurrent, --models, --classes"
            options += ", --safety-policy"
            print(
                f"{set_.prog}: error: give at least one of {options} (see {set_.prog} --help)",
                file=sys.stderr,
            )
            return EXIT_USAGE
        return run_set(args)

    set_.set_defaults(handler=check_set)

    rotate = sub.add_parser("rotate-key", help="issue a new API key, revoking the old ones")
    rotate.add_argument("tenant_id", metavar="ID")
    rotate.add_argument("--keep-old", action="store_true", help="leave the previous keys active")
    rotate.add_argument("--json", action="store_true", help="print JSON instead of text")
    rotate.set_defaults(handler=_handler(_rotate_key))
