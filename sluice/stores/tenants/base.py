"""The tenant store's one interface; every backend passes one contract suite (tests/core/test_tenants.py).

Keys are never stored: only ``sha256(key)`` in hex and a short prefix for display (``key_prefix``).
Every write goes through ``check_tenant``, so both backends accept and refuse exactly the same tenants.
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import math
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from sluice.domain import ALL_CLASSES, RequestClass, Tenant

_TENANT_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
DEV_TENANT_KEYS: dict[str, str] = {"acme": "sk-acme-dev", "globex": "sk-globex-dev"}
DEV_TOKENS_PER_MINUTE = 1_000_000
DEV_MAX_CONCURRENT_REQUESTS = 64

MAX_WEIGHT = 1000.0
_MAX_STORED_INT = 2**63 - 1  # what both databases' 64-bit integer columns hold
# What ``update`` may change: every field but the id.
MUTABLE_FIELDS = frozenset(f.name for f in dataclasses.fields(Tenant)) - {"tenant_id"}


class TenantExistsError(ValueError):
    pass


class UnknownTenantError(LookupError):
    pass


class KeyConflictError(ValueError):
    """The key is already registered to a different tenant."""


class TenantStoreUnavailable(ConnectionError):
    """The store cannot answer now (server down or unreachable, no connection within the pool's wait, a
    locked or unopenable file): nothing was read or written, and a later call may succeed. Every backend
    raises this for such failures instead of its driver's own types; any other error is a bug.

    A ``ConnectionError`` (an ``OSError``), so callers that already treat ``OSError`` as "unreachable" keep
    working. ``retry_after_s`` is set by whoever knows when to try again (the cached resolver)."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


_POLICY_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")  # as sluice.safety.config names policies


def check_tenant_id(tenant_id: str) -> None:
    if not _TENANT_ID.fullmatch(tenant_id):
        raise ValueError(f"tenant_id must match {_TENANT_ID.pattern}, got {tenant_id!r}")


def _check_limit(field: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= _MAX_STORED_INT:
        raise ValueError(f"{field} must be a whole number >= 1, or None for unlimited; got {value!r}")


def check_tenant(tenant: Tenant) -> None:
    """Refuse, with ``ValueError`` naming the field, a tenant no store may hold."""
    check_tenant_id(tenant.tenant_id)
    if not isinstance(tenant.name, str) or not tenant.name.strip():
        raise ValueError(f"name must be a non-empty string, got {tenant.name!r}")
    weight = tenant.weight
    if (
        not isinstance(weight, int | float)
        or isinstance(weight, bool)
        or not math.isfinite(weight)
        or not 0 < weight <= MAX_WEIGHT
    ):
        raise ValueError(f"weight must be > 0 and <= {MAX_WEIGHT:g}, got {weight!r}")
    _check_limit("tokens_per_minute", tenant.tokens_per_minute)
    _check_limit("max_concurrent_requests", tenant.max_concurrent_requests)
    if not isinstance(tenant.allowed_models, frozenset) or not all(
        isinstance(m, str) and m for m in tenant.allowed_models
    ):
        raise ValueError(f"allowed_models must be a frozenset of model names, got {tenant.allowed_models!r}")
    if not isinstance(tenant.allowed_classes, frozenset) or not tenant.allowed_classes:
        raise ValueError("allowed_classes must not be empty: a tenant needs at least one request class")
    unknown = sorted(str(c) for c in tenant.allowed_classes if c not in ALL_CLASSES)
    if unknown:
        valid = ", ".join(sorted(ALL_CLASSES))
        raise ValueError(f"allowed_classes: unknown class(es) {', '.join(unknown)}; valid: {valid}")
    # Whether the policy exists is the gateway's configuration (SLUICE_SAFETY_CONFIG_PATH): the CLI checks
    # it against what the gateways know; the store only refuses what can never name a policy.
    if not isinstance(tenant.safety_policy, str) or not _POLICY_NAME.fullmatch(tenant.safety_policy):
        raise ValueError(f"safety_policy must match {_POLICY_NAME.pattern}, got {tenant.safety_policy!r}")


def apply_changes(tenant: Tenant, changes: Mapping[str, Any]) -> Tenant:
    """``tenant`` with ``changes`` applied and checked (what ``update`` writes). Iterables are accepted for
    the two set fields; class names are turned into ``RequestClass``."""
    unknown = sorted(set(changes) - MUTABLE_FIELDS)
    if unknown:
        raise ValueError(
            f"cannot change {', '.join(unknown)}; changeable fields: {', '.join(sorted(MUTABLE_FIELDS))}"
        )
    values = dict(changes)
    if "allowed_models" in values:
        values["allowed_models"] = frozenset(values["allowed_models"])
    if "allowed_classes" in values:
        values["allowed_classes"] = frozenset(_request_class(c) for c in values["allowed_classes"])
    updated = dataclasses.replace(tenant, **values)
    check_tenant(updated)
    return updated


def _request_class(value: object) -> RequestClass:
    if isinstance(value, str) and value in ALL_CLASSES:
        return RequestClass(value)
    valid = ", ".join(sorted(ALL_CLASSES))
    raise ValueError(f"allowed_classes: unknown class {value!r}; valid: {valid}")


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
    async def get(self, tenant_id: str) -> Tenant:
        """The tenant; ``UnknownTenantError`` if it is not there."""

    @abstractmethod
    async def put_tenant(self, tenant: Tenant) -> None:
        """Insert the tenant, or overwrite every field of it; issues no key, touches no key."""

    @abstractmethod
    async def create(self, tenant: Tenant) -> str:
        """A new tenant with one new random key, returned (the only time it is ever visible).
        ``TenantExistsError`` if the tenant is there already."""

    @abstractmethod
    async def update(self, tenant_id: str, /, **changes: Any) -> Tenant:
        """Change only the fields given (names from ``MUTABLE_FIELDS``) in one transaction; the tenant as
        written. ``UnknownTenantError`` if it is not there, ``ValueError`` for a bad field or value."""

    @abstractmethod
    async def rotate_key(self, tenant_id: str, revoke_old: bool = True) -> str:
        """A new random key for an existing tenant, returned. With ``revoke_old`` every key it held before
        is revoked in the same transaction. ``UnknownTenantError`` if it is not there."""

    async def issue_key(self, tenant_id: str) -> str:
        """A new random key next to the tenant's others (``rotate_key`` keeping the old ones)."""
        return await self.rotate_key(tenant_id, revoke_old=False)

    @abstractmethod
    async def num_active_keys(self, tenant_id: str) -> int:
        """How many unrevoked keys the tenant holds. ``UnknownTenantError`` if it is not there."""

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


def dev_tenant(tenant_id: str) -> Tenant:
    return Tenant(
        tenant_id=tenant_id,
        name=tenant_id.capitalize(),
        tokens_per_minute=DEV_TOKENS_PER_MINUTE,
        max_concurrent_requests=DEV_MAX_CONCURRENT_REQUESTS,
    )


async def seed_dev_tenants(store: TenantStore) -> None:
    """The two dev tenants with their fixed keys (``acme``/``sk-acme-dev``, ``globex``/``sk-globex-dev``).
    Safe at every start.

    NOTE: only a tenant that is not there yet is seeded: an operator's later ``set`` or ``rotate-key``
    must survive the next start (``put_tenant`` overwrites, ``add_key`` re-activates a revoked key).
    """
    for tenant_id, api_key in DEV_TENANT_KEYS.items():
        try:
            await store.get(tenant_id)
            continue
        except UnknownTenantError:
            pass
        # Two processes starting at once may both get here: the upsert and add_key are idempotent.
        await store.put_tenant(dev_tenant(tenant_id))
        await store.add_key(tenant_id, api_key)
