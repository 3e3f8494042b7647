"""One dispatch pass: which waiting request goes to which replica next, run by the gateway's scheduler
and the fleet simulator alike.

The fair queue proposes its head; the head's standing (``dispatch.standing``: batch, over its tenant's
fair share, or neither) sets the limits it meets, and its engine priority (``dispatch.engine_priority``:
interactive within its tenant's share even if one more tenant arrived, interactive beyond that, batch)
which work it may go ahead of; ``pick_replica`` finds a replica or not (preferring the replica the head's
prefix key was last sent to, from ``affinity``: read only, its owner records each dispatch). A head that
yields and does not fit steps aside for the rest of the pass (its tenant's line, or all batch), so it
cannot block work that takes the full limits; a head with the full limits that does not fit ends the
pass (nothing behind it may overtake it).

    dispatch = DispatchPass(queue, now_s, config, min_service_s, tolerance, affinity=memory.view(now_s))
    while (placed := dispatch.next(loads, num_in_flight, weights)) is not None:
        queue.take(placed.entry, now_s)   # then hand it over (with placed.priority); update the loads
        memory.record(placed.entry.prefix_key, placed.replica.replica_id, now_s)  # if it has a key
    handle(dispatch.dropped)       # could no longer meet their deadline: never dispatched
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sluice.domain import RequestClass
from sluice.policy.dispatch import (
    DispatchConfig,
    EnginePriority,
    ReplicaLoad,
    Standing,
    engine_priority,
    pick_replica,
    standing,
)
from sluice.policy.fair_queue import FairQueue, MinServiceFn, QueueEntry
from sluice.policy.share import over_fair_share

T = TypeVar("T")
# The weight of the tenant that might arrive next, against which a tenant's engine priority is judged.
NEWCOMER_WEIGHT = 1.0


@dataclass(frozen=True)
class Placement(Generic[T]):
    """A decision of the pass: this queued request goes to this replica, with this engine priority."""

    entry: QueueEntry[T]
    replica: ReplicaLoad
    priority: EnginePriority


@dataclass
class DispatchPass(Generic[T]):
    queue: FairQueue[T]
    now_s: float
    config: DispatchConfig
    min_service_s: MinServiceFn[T]
    fair_share_tolerance: float
    share_aware: bool = True  # False: the FCFS baseline, which knows nothing of tenants' shares
    affinity: Mapping[int, str] | None = None  # prefix key -> replica id it was last sent to; None: none
    dropped: list[QueueEntry[T]] = field(default_factory=list)
    _allow_batch: bool = True
    _skip: set[str] = field(default_factory=set)

    def next(
        self,
        loads: Sequence[ReplicaLoad],
        num_in_flight: Mapping[RequestClass, Mapping[str, int]],
        weights: Mapping[str, float],
    ) -> Placement[T] | None:
        """The next request to dispatch, its replica and engine priority (still queued: ``take`` it),
        or None: done."""
        while True:
            head, dropped = self.queue.peek(
                self.now_s,
                allow_batch=self._allow_batch,
                min_service_s=self.min_service_s,
                skip_tenants=self._skip,
            )
            self.dropped += dropped
            if head is None:
                return None
            in_flight = num_in_flight[head.request_class]
            tolerance = self.fair_share_tolerance
            waiting = self.queue.waiting_tenants(head.request_class) if self.share_aware else {}
            over_share = self.share_aware and over_fair_share(
                head.tenant_id, head.weight, in_flight, weights, tolerance, waiting=waiting
            )
            holds_share = self.share_aware and over_fair_share(
                head.tenant_id, head.weight, in_flight, weights, tolerance, NEWCOMER_WEIGHT, waiting
            )
            head_standing = standing(head.request_class, over_share)
            priority = engine_priority(head.request_class, holds_share)
            load = pick_replica(
                loads,
                head.kv_tokens,
                head_standing,
                self.config,
                priority,
                prefix_key=head.prefix_key,
                affinity=self.affinity,
                request_id=head.request_id,
            )
            if load is not None:
                return Placement(head, load, priority)
            if head_standing is Standing.UNDER_SHARE:
                return None
            if head.request_class is RequestClass.BATCH:
                self._allow_batch = False
            else:
                self._skip.add(head.tenant_id)
