"""The dev admin token: a fixed platform-admin token for ``make run``, like the dev tenant keys.

Anyone can read it in the source, so it exists only where ``SLUICE_DEV_TENANTS`` is true
(``sluice.stores.openers.open_admin_token_store`` seeds it then; ``make run`` turns that on), and the service
logs a warning while it is on.
"""

from __future__ import annotations

import contextlib

from sluice.stores.admin_tokens.base import AdminTokenExistsError, AdminTokenStore
from sluice.stores.admin_tokens.roles import Role

DEV_ADMIN_TOKEN_NAME = "dev-admin"
DEV_ADMIN_TOKEN = "sladm-dev-platform-admin"


async def ensure_dev_admin_token(store: AdminTokenStore) -> str | None:
    """Make sure the dev token is there, and return it; None if an operator revoked it (or gave its name
    to another token). Safe at every start, from several processes at once.

    NOTE: only a name never used is seeded: an operator's ``revoke`` must survive the next start, as
    ``seed_dev_tenants`` keeps an operator's changes.
    """
    if await store.resolve(DEV_ADMIN_TOKEN, record_use=False) is not None:
        return DEV_ADMIN_TOKEN
    if any(t.name == DEV_ADMIN_TOKEN_NAME for t in await store.list()):
        return None
    # Another process starting at the same moment may have seeded it first.
    with contextlib.suppress(AdminTokenExistsError):
        await store.create(DEV_ADMIN_TOKEN_NAME, Role.PLATFORM_ADMIN, token=DEV_ADMIN_TOKEN)
    found = await store.resolve(DEV_ADMIN_TOKEN, record_use=False)
    return DEV_ADMIN_TOKEN if found is not None else None
