"""The admin token store's schema, as numbered migrations applied at ``open()`` (see ``sluice.stores.db``), in
the same database as the tenant store and the ledger but in a table of its own: a tenant key is never looked
up here, an admin token never in ``api_keys``.

Only a token's SHA-256 (hex) and a short non-secret prefix for display are stored, never the token. A
name is unique among active tokens (a partial index), so a revoked token's name can be given again while
the revoked row stays listed.
"""

from __future__ import annotations

from sluice.stores.admin_tokens.roles import ROLES_BY_RANK
from sluice.stores.db import Migration

COMPONENT = "admin_tokens"

_ROLES = ", ".join(f"'{role}'" for role in ROLES_BY_RANK)
_DDL = """
    CREATE TABLE admin_tokens (
        token_sha256 TEXT PRIMARY KEY CHECK (length(token_sha256) = 64),
        token_prefix TEXT NOT NULL,
        name TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ({roles})),
        created_at {ts} NOT NULL,
        last_used_at {ts},
        revoked_at {ts}
    );
    CREATE UNIQUE INDEX admin_tokens_active_name ON admin_tokens (name) WHERE revoked_at IS NULL
""".replace("{roles}", _ROLES)

MIGRATIONS: list[Migration] = [
    Migration(
        version=1,
        name="admin tokens",
        sqlite=_DDL.format(ts="TEXT"),
        postgres=_DDL.format(ts="TIMESTAMPTZ"),
    ),
]

# The listed columns, in the order of ``AdminToken``'s fields.
LIST_COLUMNS = "name, role, token_prefix, created_at, last_used_at, revoked_at"
