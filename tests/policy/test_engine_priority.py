"""Engine priority from a tenant's standing, and a dispatch gate that lets a request through where the
engine would make room for it by preempting lower-priority work."""

from __future__ import annotations

from sluice.domain import RequestClass
from sluice.policy.dispatch import (
    DispatchConfig,
    EnginePriority,
    PriorityLoad,
    ReplicaLoad,
    Standing,
    engine_priority,
    pick_replica,
)
from sluice.policy.dispatch_pass import NEWCOMER_WEIGHT, DispatchPass
from sluice.policy.fair_queue import FairQueue, QueueEntry, WaitingRequest
from sluice.policy.share import InFlight, over_fair_share

DISPATCH = DispatchConfig(itl_target_ms=50.0, max_waiting_per_replica=8)
UNDER, OVER, BATCH = EnginePriority.UNDER_SHARE, EnginePriority.OVER_SHARE, EnginePriority.BATCH


def test_a_lone_tenant_borrows_beyond_its_first_request() -> None:
    """Alone it is never over its share (the gate's test), but all it holds beyond one request is what a
    newcomer would be owed: that work gets the preemptible priority."""
    assert not over_fair_share("globex", 1.0, {"globex": 63}, {}, 0.25)
    assert not over_fair_share("globex", 1.0, {}, {}, 0.25, NEWCOMER_WEIGHT)
    assert over_fair_share("globex", 1.0, {"globex": 1}, {}, 0.25, NEWCOMER_WEIGHT)
    # The newcomer: 1 of 66 in flight is far under a third.
    assert not over_fair_share("acme", 1.0, {"globex": 64, "acme": 1}, {}, 0.25, NEWCOMER_WEIGHT)


def test_engine_priority_orders_under_share_over_share_batch() -> None:
    assert engine_priority(RequestClass.INTERACTIVE, holds_share=False) is UNDER
    assert engine_priority(RequestClass.INTERACTIVE, holds_share=True) is OVER
    assert engine_priority(RequestClass.BATCH, holds_share=False) is BATCH
    assert UNDER < OVER < BATCH


def slow(by_priority: tuple[PriorityLoad, ...], *, waiting: int = 9) -> ReplicaLoad:
    """A replica over its latency target with its waiting places full (by its own count) and KV free."""
    return ReplicaLoad("r", 5_000, 10_000, waiting, 40, itl_ms=120.0, by_priority=by_priority)


def test_a_slow_replica_takes_a_minority_of_higher_priority_work() -> None:
    """A lone tenant's flood (its borrowed work at OVER_SHARE) cannot hold a newcomer out."""
    replica = slow((PriorityLoad(2, 0, 200), PriorityLoad(40, 9, 9_000), PriorityLoad()))
    assert pick_replica([replica], 500, Standing.UNDER_SHARE, DISPATCH, UNDER) is replica
    # Its own class has nothing to go ahead of: the latency and waiting gates hold.
    assert pick_replica([replica], 500, Standing.UNDER_SHARE, DISPATCH, OVER) is None
    # Once the higher class is not a minority, the latency gate holds for it too.
    even = slow((PriorityLoad(40, 0, 4_000), PriorityLoad(40, 9, 4_000), PriorityLoad()))
    assert pick_replica([even], 500, Standing.UNDER_SHARE, DISPATCH, UNDER) is None
    # KV the lower class holds is not free: preempting for KV overwrites the victim's blocks.
    assert pick_replica([replica], 5_001, Standing.UNDER_SHARE, DISPATCH, UNDER) is None


def test_waiting_work_of_its_class_or_above_still_holds_it_back() -> None:
    replica = slow((PriorityLoad(8, 8, 800), PriorityLoad(30, 1, 9_000), PriorityLoad()))
    assert pick_replica([replica], 100, Standing.UNDER_SHARE, DISPATCH, UNDER) is None


def test_work_that_yields_leaves_waiting_places_free() -> None:
    """Over-share and batch work may fill 6 of 8 waiting places; the last 2 are for the rest."""
    six_waiting = ReplicaLoad("r", 9_000, 10_000, 6, 6, itl_ms=10.0)
    assert pick_replica([six_waiting], 100, Standing.OVER_SHARE, DISPATCH) is None
    assert pick_replica([six_waiting], 100, Standing.BATCH, DISPATCH) is None
    assert pick_replica([six_waiting], 100, Standing.UNDER_SHARE, DISPATCH) is six_waiting
    assert DispatchConfig(max_waiting_per_replica=1).max_waiting(Standing.OVER_SHARE) == 1


def entry(request_id: str, tenant: str, arrival_s: float = 0.0) -> QueueEntry[None]:
    return QueueEntry(
        WaitingRequest(request_id, tenant, 1.0, RequestClass.INTERACTIVE, 10, 100, arrival_s, 1e9), None
    )


def test_the_pass_hands_out_the_priority_it_judged_the_standing_by() -> None:
    queue: FairQueue[None] = FairQueue()
    in_flight = InFlight()
    for _ in range(10):
        in_flight.add(RequestClass.INTERACTIVE, "globex")
    queue.push(entry("g", "globex"))
    queue.push(entry("a", "acme"))
    replica = ReplicaLoad("r", 9_000, 10_000, 0, 10, itl_ms=10.0, by_priority=(PriorityLoad(),) * 3)
    placements = []
    dispatch = DispatchPass(queue, 0.0, DISPATCH, lambda e: 0.0, 0.25)
    while (placed := dispatch.next([replica], in_flight, {})) is not None:
        queue.take(placed.entry, 0.0)
        placements.append((placed.entry.tenant_id, placed.priority))
    assert sorted(placements) == [("acme", UNDER), ("globex", OVER)]


def test_a_tenant_waiting_with_nothing_in_flight_is_owed_its_share() -> None:
    """The flood holds the whole running cap and looks alone the moment the quiet tenant's last request
    ends; the quiet tenant's next request ties with the flood in the fair queue, behind its older head.
    Counted as active while it waits, it makes the flood's head yield, and goes now instead of after one
    of the flood's requests ends."""
    queue: FairQueue[None] = FairQueue()
    in_flight = InFlight()
    for _ in range(10):
        in_flight.add(RequestClass.INTERACTIVE, "globex")
    queue.push(entry("g", "globex", arrival_s=0.0))
    queue.push(entry("a", "acme", arrival_s=1.0))
    assert queue.waiting_tenants(RequestClass.INTERACTIVE) == {"globex": 1.0, "acme": 1.0}
    borrowed = (PriorityLoad(), PriorityLoad(10, 0, 1_100), PriorityLoad())
    full = ReplicaLoad("r", 8_000, 10_000, 0, 10, itl_ms=10.0, by_priority=borrowed, running_cap=10)
    dispatch = DispatchPass(queue, 2.0, DISPATCH, lambda e: 0.0, 0.25)
    placed = dispatch.next([full], in_flight, {})
    assert placed is not None and (placed.entry.tenant_id, placed.priority) == ("acme", UNDER)
    queue.take(placed.entry, 2.0)
    in_flight.add(RequestClass.INTERACTIVE, "acme")
    assert dispatch.next([full], in_flight, {}) is None  # the flood's head waits for its own room
    # Without the waiting tenant the flood is alone: its head takes the full limits, fails, ends the pass.
    assert not over_fair_share("globex", 1.0, {"globex": 10}, {}, 0.25)
    assert over_fair_share("globex", 1.0, {"globex": 10}, {}, 0.25, waiting={"acme": 1.0})
    assert not over_fair_share("globex", 1.0, {"globex": 10}, {}, 0.25, waiting={"globex": 1.0})
