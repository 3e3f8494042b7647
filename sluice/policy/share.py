"""Is a tenant already holding more than its share of the replicas? (the seed: "tenants above their fair
share are throttled before tenants below it").

The fair queue decides the ORDER of waiting requests; this decides how much room a request may take
once it is at the head. A tenant over its weighted share of the requests in flight yields like batch
work (``dispatch.pick_replica(..., yields=True)``): it may fill replicas only up to the softer limits,
leaving headroom for the bursts of tenants under their share. Without it, one tenant with a deep
backlog fills every free slot the moment it frees, and everyone else's burst meets a full fleet.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluice.domain import RequestClass


class InFlight(dict[RequestClass, dict[str, int]]):
    """Requests handed to replicas and not yet ended, per class, per tenant (shares are compared within a
    class: a tenant's batch job must not make its interactive requests yield). A tenant with none has
    no entry. Owned by one dispatcher (the gateway's scheduler, or the simulated fleet)."""

    def __init__(self) -> None:
        super().__init__({c: {} for c in RequestClass})

    def add(self, request_class: RequestClass, tenant_id: str) -> None:
        counts = self[request_class]
        counts[tenant_id] = counts.get(tenant_id, 0) + 1

    def remove(self, request_class: RequestClass, tenant_id: str) -> None:
        counts = self[request_class]
        remaining = counts[tenant_id] - 1
        if remaining:
            counts[tenant_id] = remaining
        else:
            del counts[tenant_id]


def over_fair_share(
    tenant_id: str,
    weight: float,
    num_in_flight: Mapping[str, int],
    weights: Mapping[str, float],
    tolerance: float = 0.25,
    newcomer_weight: float = 0.0,
    waiting: Mapping[str, float] | None = None,
) -> bool:
    """True if, with one more request, ``tenant_id`` would hold more than ``1 + tolerance`` times its
    weighted share of all requests in flight (shares among tenants with something in flight or waiting,
    this one included). ``weights`` holds the other tenants' weights (1.0 if missing).

    ``waiting``: the tenants with requests queued, and their weights. A tenant waiting is owed its share
    though it holds nothing yet: without it, a flood that holds every slot looks alone the moment a quiet
    tenant's last request ends, takes the full limits again, and the quiet tenant's next request (tied
    with the flood in the fair queue, and behind its older head) waits for one of the flood's to end.

    ``newcomer_weight`` > 0 counts one more tenant of that weight with one request in flight: the share
    the tenant would keep if someone else arrived now. A tenant alone is never over its share, but it
    is over this one beyond its first request: what it holds beyond that is borrowed, and the engine
    may take it back for a newcomer (``dispatch.engine_priority``)."""
    own = num_in_flight.get(tenant_id, 0)
    total = sum(num_in_flight.values()) + 1 + (1 if newcomer_weight > 0 else 0)
    others = {t: weights.get(t, 1.0) for t, n in num_in_flight.items() if n > 0 and t != tenant_id}
    for t, w in (waiting or {}).items():
        if t != tenant_id:
            others.setdefault(t, w)
    active_weight = weight + newcomer_weight + sum(others.values())
    fair = total * weight / active_weight
    return own + 1 > fair * (1 + tolerance)
