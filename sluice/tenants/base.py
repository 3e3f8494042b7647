"""The tenant store's one interface; every backend passes one contract suite (tests/core/test_tenants.py).

Keys are never stored: only ``sha256(key)`` in hex and a short prefix for display (``key_prefix``).
"""

from __future__ import annotations

import builtins
import hashlib
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Iterable

from sluice.domain import Tenant

_TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
DEV_TENANT_KEYS: dict[str, str] = {"acme": "sk-acme-dev", "globex": "sk-globex-dev"}


class TenantExistsError(ValueError):
    pass


class UnknownTenantError(LookupError):
    pass


class KeyConflictError(ValueError):
    """The key is already registered to a different tenant."""


def check_tenant_id(tenant_id: str) -> None:
    if not _TENANT_ID.match(tenant_id):
        raise ValueError(f"tenant_id must match {_TENANT_ID.pattern}, got {tenant_id!r}")


def hash_key(api_key: str) -> str:
    """What is stored and looked up: the key's SHA-256, hex."""
    return hashlib.sha256(api_key.encode("utf-8")).hexdigest()


def key_prefix(api_key: str) -> str:
    """A non-secret fragment for display: at most a third of the key and at most 12 characters
    (``sk-acme-AbCd`` for a generated key: 4 of its 32 random characters)."""
    return api_key[: min(12, len(api_key) // 3)]


def new_api_key(tenant_id: str) -> str:
    """``sk-<tenant>-<32 urlsafe characters>``."""
    return f"sk-{tenant_id}-{secrets.token_urlsafe(24)}"


class TenantStore(ABC):
    @abstractmethod
    async def open(self) -> None:
        """Connect and apply pending schema migrations (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def resolve(self, api_key: str) -> Tenant | None:
        """The tenant owning this (unrevoked) key, or None. Looks up by hash, confirms in constant time."""

    @abstractmethod
    async def put_tenant(self, tenant: Tenant) -> None:
        """Insert the tenant, or update its name and allowed models; issues no key."""

    @abstractmethod
    async def create(self, tenant_id: str, name: str, allowed_models: Iterable[str] = ()) -> str:
        """A new tenant with one new random key, returned (the only time it is ever visible).
        ``TenantExistsError`` if the tenant is there already."""

    @abstractmethod
    async def issue_key(self, tenant_id: str) -> str:
        """A new random key for an existing tenant (rotation). ``UnknownTenantError`` if it is not there."""

    @abstractmethod
    async def add_key(self, tenant_id: str, api_key: str) -> None:
        """Register a given key (the fixed dev keys). Idempotent for the same tenant and key, and
        re-activates it if revoked. ``KeyConflictError`` if another tenant holds it, ``UnknownTenantError``
        if the tenant is not there."""

    @abstractmethod
    async def revoke_key(self, api_key: str) -> bool:
        """Stop this key resolving. True if an active key was revoked."""

    @abstractmethod
    async def list(self) -> builtins.list[Tenant]:
        """Every tenant, by tenant_id."""


async def seed_dev_tenants(store: TenantStore) -> None:
    """The two dev tenants with their fixed keys (``acme``/``sk-acme-dev``, ``globex``/``sk-globex-dev``).
    Idempotent: safe at every start."""
    for tenant_id, api_key in DEV_TENANT_KEYS.items():
        await store.put_tenant(Tenant(tenant_id=tenant_id, name=tenant_id.capitalize()))
        await store.add_key(tenant_id, api_key)
