"""The tenant store's schema, as numbered migrations applied at ``open()`` (see ``sluice.stores.db``), and how
a ``Tenant`` is laid out in a row (the same for both backends).

Only a key's SHA-256 (hex) and a short non-secret prefix for display are stored, never the key.
``allowed_models`` is a JSON array of model names (empty: every model); ``allowed_classes`` a JSON array
of request classes (never empty); NULL ``tokens_per_minute`` / ``max_concurrent_requests``: unlimited;
``safety_policy`` names a safety policy (``sluice.safety.policy``), resolved by the gateway.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sluice.domain import ALL_CLASSES, RequestClass, Tenant
from sluice.stores.db import Migration

COMPONENT = "tenants"

_DDL = """
    CREATE TABLE tenants (
        tenant_id TEXT PRIMARY KEY,
        name TEXT NOT NULL,
        allowed_models TEXT NOT NULL DEFAULT '[]',
        created_at {ts} NOT NULL
    );
    CREATE TABLE api_keys (
        key_sha256 TEXT PRIMARY KEY CHECK (length(key_sha256) = 64),
        key_prefix TEXT NOT NULL,
        tenant_id TEXT NOT NULL REFERENCES tenants (tenant_id) ON DELETE CASCADE,
        created_at {ts} NOT NULL,
        revoked_at {ts}
    );
    CREATE INDEX api_keys_tenant ON api_keys (tenant_id)
"""


def _classes_json(classes: frozenset[RequestClass]) -> str:
    return json.dumps(sorted(str(c) for c in classes))


# Existing tenants keep what they had: weight 1, no limits, both classes.
_V2 = """
    ALTER TABLE tenants ADD COLUMN weight {real} NOT NULL DEFAULT 1.0 CHECK (weight > 0);
    ALTER TABLE tenants ADD COLUMN tokens_per_minute {int} CHECK (tokens_per_minute >= 1);
    ALTER TABLE tenants ADD COLUMN max_concurrent_requests {int} CHECK (max_concurrent_requests >= 1);
    ALTER TABLE tenants ADD COLUMN allowed_classes TEXT NOT NULL DEFAULT '{classes}'
""".replace("{classes}", _classes_json(ALL_CLASSES))

# Existing tenants keep the default policy (the built-in rules, PII included).
_V3 = "ALTER TABLE tenants ADD COLUMN safety_policy TEXT NOT NULL DEFAULT 'default'"

MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        name="tenants and api_keys",
        sqlite=_DDL.format(ts="TEXT"),
        postgres=_DDL.format(ts="TIMESTAMPTZ"),
    ),
    Migration(
        version=2,
        name="tenant weight, token budget, concurrency cap, allowed classes",
        sqlite=_V2.format(real="REAL", int="INTEGER"),
        postgres=_V2.format(real="DOUBLE PRECISION", int="BIGINT"),
    ),
    Migration(version=3, name="tenant safety policy", sqlite=_V3, postgres=_V3),
]

# The tenant's columns, in the order of ``tenant_row`` and ``tenant_from_row``.
TENANT_COLUMNS: tuple[str, ...] = (
    "tenant_id",
    "name",
    "allowed_models",
    "weight",
    "tokens_per_minute",
    "max_concurrent_requests",
    "allowed_classes",
    "safety_policy",
)


def select_columns(alias: str = "") -> str:
    """``tenant_id, name, ...`` (each prefixed ``alias.`` if given), for a SELECT list."""
    return ", ".join(f"{alias}.{c}" if alias else c for c in TENANT_COLUMNS)


def tenant_row(tenant: Tenant) -> tuple[Any, ...]:
    """The values of ``TENANT_COLUMNS`` for this tenant."""
    return (
        tenant.tenant_id,
        tenant.name,
        json.dumps(sorted(tenant.allowed_models)),
        float(tenant.weight),
        tenant.tokens_per_minute,
        tenant.max_concurrent_requests,
        _classes_json(tenant.allowed_classes),
        tenant.safety_policy,
    )


def tenant_from_row(row: Sequence[Any]) -> Tenant:
    tenant_id, name, models_json, weight, tokens_per_minute, max_concurrent, classes_json, safety = row
    return Tenant(
        tenant_id=tenant_id,
        name=name,
        allowed_models=frozenset(json.loads(models_json)),
        weight=float(weight),
        tokens_per_minute=tokens_per_minute,
        max_concurrent_requests=max_concurrent,
        allowed_classes=frozenset(RequestClass(c) for c in json.loads(classes_json)),
        safety_policy=safety,
    )
