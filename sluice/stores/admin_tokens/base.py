"""The admin token store's one interface; every backend passes one contract suite
(tests/control_plane/test_admin_tokens.py).

Admin tokens are the control plane's credentials (``sladm-<32 urlsafe characters>``), each with a name
and a role (``sluice.stores.admin_tokens.roles``). They are not tenant keys and never stand in for one: their
own table (``admin_tokens``), their own lookup, their own format; a tenant key (``sk-...``) never has the
admin format, so ``resolve`` refuses it before any lookup, and the tenant store never reads this table.
As for tenant keys, only ``sha256(token)`` in hex and a short prefix for display are stored.

Why ``sluice/`` and not ``control_plane/auth/``: it is a storage backend family like the tenant store
and the ledger (SQLite and PostgreSQL, migrations through ``sluice.stores.db``, a contract suite), and two
applications need it: the control plane (its service and ``sluice admin-tokens``) and the dev stack
(``gateway.devstack`` seeds and prints the dev admin token, ``sluice.stores.admin_tokens.dev``). Applications
do not import each other, so it lives below both. The gateway's request path never imports it.
"""

from __future__ import annotations

import builtins
import re
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime

from sluice.stores.admin_tokens.roles import Role, parse_role
from sluice.stores.tenants.base import hash_key, key_prefix

TOKEN_PREFIX = "sladm-"
# The generated tokens and the fixed dev one both fit; a tenant key (``sk-...``) never does.
_TOKEN = re.compile(r"^sladm-[A-Za-z0-9_-]{16,128}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.@-]{0,62}$")


class AdminTokenExistsError(ValueError):
    """An active token already has this name, or this very token is registered already."""


class UnknownAdminTokenError(LookupError):
    """No active token has this name."""


class AdminTokenStoreUnavailable(ConnectionError):
    """The store cannot answer now (server down or unreachable, no connection within the pool's wait, a
    locked or unopenable file): nothing was read or written, and a later call may succeed. Every backend
    raises this for such failures instead of its driver's own types; any other error is a bug."""


@dataclass(frozen=True)
class AdminPrincipal:
    """Who an admin token speaks for."""

    name: str
    role: Role


@dataclass(frozen=True)
class AdminToken:
    """A token as listed: never the token, never its hash. Times are timezone-aware (UTC)."""

    name: str
    role: Role
    token_prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def hash_token(token: str) -> str:
    """What is stored and looked up: the token's SHA-256, hex (the tenant keys' scheme)."""
    return hash_key(token)


def token_prefix(token: str) -> str:
    """A non-secret fragment for display (``sladm-AbCdEf``: 6 of a generated token's 32 random
    characters), as tenant keys show theirs."""
    return key_prefix(token)


def new_admin_token() -> str:
    """``sladm-<32 urlsafe characters>`` (192 random bits)."""
    return f"{TOKEN_PREFIX}{secrets.token_urlsafe(24)}"


def is_admin_token_format(token: str) -> bool:
    """Whether ``token`` has the admin format at all (a tenant key never has)."""
    return _TOKEN.fullmatch(token) is not None


def check_token_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"token name must be 1-63 lower-case letters, digits, '.', '_', '@' or '-' starting with a "
            f"letter or digit, got {name!r}"
        )


def check_new_token(name: str, role: Role | str, token: str) -> Role:
    """Refuse, with ``ValueError`` naming what is wrong, a token no store may hold; the role as a
    ``Role``."""
    check_token_name(name)
    if not isinstance(token, str) or not is_admin_token_format(token):
        raise ValueError(
            f"an admin token must be {TOKEN_PREFIX} followed by 16-128 letters, digits, '_' or '-'"
        )
    return role if isinstance(role, Role) else parse_role(role)


class AdminTokenStore(ABC):
    @abstractmethod
    async def open(self) -> None:
        """Connect and apply pending schema migrations (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def ping(self) -> None:
        """Return if the store answers now; ``AdminTokenStoreUnavailable`` if not (readiness)."""

    @abstractmethod
    async def create(self, name: str, role: Role | str, *, token: str | None = None) -> str:
        """A new active token named ``name`` with ``role``, returned (the only time it is visible): a
        random one, or ``token`` if given (the fixed dev token). ``AdminTokenExistsError`` if an active
        token has the name (a revoked one's name may be reused) or the given token is registered already;
        ``ValueError`` for a bad name, role or token."""

    @abstractmethod
    async def list(self) -> builtins.list[AdminToken]:
        """Every token, active and revoked, by name then creation time."""

    @abstractmethod
    async def revoke(self, name: str) -> AdminToken:
        """Stop the active token named ``name`` resolving, at once; the token as revoked.
        ``UnknownAdminTokenError`` if no active token has the name."""

    @abstractmethod
    async def resolve(self, token: str, *, record_use: bool = True) -> AdminPrincipal | None:
        """The principal of this active token, or None (unknown, revoked, or not an admin token at all:
        a tenant key is never looked up). Looks up by hash, confirms in constant time. With
        ``record_use`` its ``last_used_at`` becomes now, in the same statement."""
