"""Audit: ``BatchStore.num_active`` (what ``SLUICE_BATCH_MAX_ACTIVE_PER_TENANT`` is held against), over
SQLite and the real PostgreSQL: it counts one tenant's batches queued or running, never another's, and a
batch leaves the count once it ends."""

from __future__ import annotations

import pytest
from test_batch_store import BatchBackend, at, backend, new_batch, store  # noqa: F401  (fixtures by name)

from sluice.stores.batches.base import BatchStatus, BatchStore

pytestmark = pytest.mark.anyio
LEASE_S = 30.0


async def test_num_active_counts_the_tenants_batches_until_they_end(store: BatchStore) -> None:  # noqa: F811
    assert await store.num_active("acme") == 0
    await store.create(new_batch("b1"))
    await store.create(new_batch("b2", created_s=1))
    await store.create(new_batch("b3", created_s=2, status=BatchStatus.IN_PROGRESS))
    await store.create(new_batch("g1", "globex", created_s=3))
    assert (await store.num_active("acme"), await store.num_active("globex")) == (3, 1)

    claimed = await store.claim("r1", LEASE_S, at(10))
    assert claimed is not None and claimed.batch_id == "b1"
    await store.advance("b1", "r1", BatchStatus.FINALIZING, at(11))
    assert await store.num_active("acme") == 3  # finalizing: still the runners' work
    await store.advance("b1", "r1", BatchStatus.COMPLETED, at(12))
    assert await store.num_active("acme") == 2
    await store.request_cancel("acme", "b2", at(13))
    assert await store.num_active("acme") == 2  # cancelling: its results are still to write
    assert await store.num_active("nobody") == 0


async def test_claim_gives_every_tenant_its_nth_batch_before_anyone_an_n_plus_first(
    store: BatchStore,  # noqa: F811
) -> None:
    """Not only the first: a tenant with many batches queued (older) gets its third only once every
    tenant with work left has two running, so its backlog never holds another tenant's second batch."""
    for i in range(4):
        await store.create(new_batch(f"batch_acme{i}", "acme", created_s=i))
    await store.create(new_batch("batch_globex0", "globex", created_s=5))
    await store.create(new_batch("batch_globex1", "globex", created_s=6))
    claimed = [await store.claim(f"r{i}", LEASE_S, at(10)) for i in range(6)]
    assert [b.batch_id if b else None for b in claimed] == [
        "batch_acme0", "batch_globex0", "batch_acme1", "batch_globex1", "batch_acme2", "batch_acme3"
    ]  # fmt: skip
