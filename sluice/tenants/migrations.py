"""The tenant store's schema, as numbered migrations applied at ``open()`` (see ``sluice.db``).

Only a key's SHA-256 (hex) and a short non-secret prefix for display are stored, never the key.
``allowed_models`` is a JSON array of model names (empty: every model).
"""

from __future__ import annotations

from sluice.db import Migration

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

MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        name="tenants and api_keys",
        sqlite=_DDL.format(ts="TEXT"),
        postgres=_DDL.format(ts="TIMESTAMPTZ"),
    ),
]
