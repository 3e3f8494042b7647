"""Which replica may take the next request: gated on its KV headroom, its own waiting count and its
inter-token latency against a target, as its Triton metrics report them
(``nv_trt_llm_kv_cache_block_metrics``, ``nv_trt_llm_request_metrics``; the simulator's replicas report
the same fields).

- KV: a replica takes a request only if its free KV tokens cover the request's prompt + max_tokens (what
  the engine's own admission needs).
- Waiting: a replica with ``max_waiting_per_replica`` requests already waiting inside takes no more;
  they wait in the gateway's fair queue, where the order is decided.
- Latency: a replica runs at most its ``running_cap``, the batch bounded by the inter-token target
  (``batch_bound``: it shrinks while the p95 of its streams' gaps is over the target and grows while it
  is under); more sequences make every step longer. A replica without a cap (the simulator's) whose
  recent inter-token latency is above the target takes nothing new until it drops.
- Work that yields meets softer limits, so the headroom above stays for interactive work of tenants
  under their share (``Standing``): batch fills ``batch_itl_fraction`` of the running cap (without a
  cap: needs the inter-token latency under that share of the target); a tenant over its fair share
  (``share.over_fair_share``), the stricter ``over_share_itl_fraction``; both leave
  ``yield_kv_reserve_fraction`` of the KV free and may fill only ``1 - yield_waiting_reserve_fraction``
  of the waiting places (at least one).
- Engine priority (``EnginePriority``, the wire type of ``sluice.wire``, sent with the
  request): the engine admits a request ahead of work of a lower priority and preempts it to make room.
  So a request finds a replica that runs lower-priority work open to it: that work's KV counts as
  free, and neither the latency gate nor waiting work of lower priority holds it back (only waiting
  work of its priority or above counts).
Among replicas that pass, the best score wins (``placement``: KV headroom, waiting, inter-token latency
and tenant-scoped prefix affinity, weighted; ties to the smallest replica id), unless
``DispatchConfig.placement`` names a baseline rule (``least_loaded``, ``random``) to measure it against.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from sluice.domain import RequestClass
from sluice.policy.load import PriorityLoad, ReplicaLoad
from sluice.policy.placement import (
    PlacementRule,
    ScoreWeights,
    best,
    hashed,
    least_loaded,
    saturated,
    score,
)
from sluice.wire import EnginePriority

# Re-exported: callers take the load types and the wire priority from here, beside the gate that reads them.
__all__ = [
    "DispatchConfig",
    "EnginePriority",
    "PlacementRule",
    "PriorityLoad",
    "ReplicaLoad",
    "ScoreWeights",
    "Standing",
    "accepts",
    "engine_priority",
    "pick_replica",
    "standing",
]


def engine_priority(request_class: RequestClass, holds_share: bool) -> EnginePriority:
    """``holds_share``: the tenant would be over its share even if one more tenant arrived
    (``share.over_fair_share`` with a newcomer), so its work is what a newcomer may take room from."""
    if request_class is RequestClass.BATCH:
        return EnginePriority.BATCH
    return EnginePriority.OVER_SHARE if holds_share else EnginePriority.UNDER_SHARE


class Standing(StrEnum):
    """How much of a replica a request may take."""

    UNDER_SHARE = "under_share"  # interactive, its tenant within its fair share: the full limits
    BATCH = "batch"  # soaks up what interactive leaves
    OVER_SHARE = "over_share"  # its tenant already holds more than its fair share: yields most


def standing(request_class: RequestClass, over_share: bool) -> Standing:
    if over_share:
        return Standing.OVER_SHARE
    return Standing.BATCH if request_class is RequestClass.BATCH else Standing.UNDER_SHARE


@dataclass(frozen=True)
class DispatchConfig:
    itl_target_ms: float = 40.0
    max_waiting_per_replica: int = 1
    yield_kv_reserve_fraction: float = 0.2  # of a replica's KV that batch and over-share work leave free
    batch_itl_fraction: float = 0.9  # batch needs the ITL under this share of the target
    over_share_itl_fraction: float = 0.75  # a tenant over its share needs the ITL under this share
    yield_waiting_reserve_fraction: float = 0.25  # of the waiting places batch and over-share work leave
    weights: ScoreWeights = field(
        default_factory=ScoreWeights
    )  # how replicas that pass are ranked (``placement``)
    # Affinity yields once a replica has used this share of its KV (``placement.saturated``).
    saturation_kv_used_fraction: float = 0.9
    placement: PlacementRule = PlacementRule.SCORE  # the rule among replicas that pass (``pick_replica``)

    def __post_init__(self) -> None:
        if not 0 < self.saturation_kv_used_fraction <= 1:
            raise ValueError("saturation_kv_used_fraction must be in (0, 1]")
        if self.itl_target_ms <= 0 or self.max_waiting_per_replica < 1:
            raise ValueError("itl_target_ms must be > 0 and max_waiting_per_replica >= 1")
        if not 0 <= self.yield_kv_reserve_fraction < 1:
            raise ValueError("yield_kv_reserve_fraction must be in [0, 1)")
        if not (0 < self.batch_itl_fraction <= 1 and 0 < self.over_share_itl_fraction <= 1):
            raise ValueError("batch_itl_fraction and over_share_itl_fraction must be in (0, 1]")
        if not 0 <= self.yield_waiting_reserve_fraction < 1:
            raise ValueError("yield_waiting_reserve_fraction must be in [0, 1)")

    def itl_limit_ms(self, standing: Standing) -> float:
        fraction = {
            Standing.UNDER_SHARE: 1.0,
            Standing.BATCH: self.batch_itl_fraction,
            Standing.OVER_SHARE: self.over_share_itl_fraction,
        }[standing]
        return self.itl_target_ms * fraction

    def max_waiting(self, standing: Standing) -> int:
        """Requests that may wait inside a replica before this standing's next one is held back."""
        if standing is Standing.UNDER_SHARE:
            return self.max_waiting_per_replica
        return max(1, int(self.max_waiting_per_replica * (1 - self.yield_waiting_reserve_fraction)))


def accepts(
    load: ReplicaLoad,
    kv_tokens: int,
    standing: Standing,
    config: DispatchConfig,
    priority: EnginePriority = EnginePriority.UNDER_SHARE,
) -> bool:
    lower = load.below(priority) if load.by_priority else PriorityLoad()
    num_waiting = load.num_waiting
    if lower.num_in_flight:
        # Only waiting work of its priority or above goes before it (the replica's own count would
        # include lower-priority work it preempted).
        num_waiting = min(num_waiting, sum(p.num_waiting for p in load.by_priority[: priority + 1]))
    if num_waiting >= config.max_waiting(standing):
        return False
    # A slow replica takes no more work, except work of a minority of higher priority going ahead of
    # the lower-priority rest: one tenant's flood, however it got there, cannot hold out a newcomer.
    num_above = sum(p.num_in_flight for p in load.by_priority[: priority + 1])
    minority = lower.num_in_flight > num_above
    if load.running_cap is not None:
        # The batch bounded by the target (``batch_bound``): work that yields fills only its share of it,
        # and lower-priority work, which the engine preempts for this request, does not count.
        num_counted = num_above if load.by_priority else load.num_running
        share = config.itl_limit_ms(standing) / config.itl_target_ms
        if num_counted >= max(1, math.floor(load.running_cap * share)):
            return False
    else:
        limit_ms = config.itl_limit_ms(standing)
        slow = load.num_running > 0 and load.itl_ms is not None and load.itl_ms > limit_ms
        if slow and not minority:
            return False
    yields = standing is not Standing.UNDER_SHARE
    reserve = config.yield_kv_reserve_fraction * load.total_kv_tokens if yields else 0.0
    # NOTE: lower-priority work's KV does not count as free: the engine would preempt it to make room,
    # but the blocks it frees are the ones overwritten, so its recompute is a full prefill.
    return load.free_kv_tokens - reserve >= kv_tokens


def pick_replica(
    loads: Sequence[ReplicaLoad],
    kv_tokens: int,
    standing: Standing,
    config: DispatchConfig,
    priority: EnginePriority = EnginePriority.UNDER_SHARE,
    *,
    prefix_key: int | None = None,
    affinity: Mapping[int, str] | None = None,
    request_id: str | None = None,
) -> ReplicaLoad | None:
    """The replica to send a request of ``kv_tokens`` (prompt + max_tokens) to, or None: keep it queued.

    Among the replicas that ``accepts`` it, the best ``placement.score`` wins (ties: the smallest replica
    id). ``affinity`` (read only; its owner records each dispatch) maps a prefix key to the replica it
    was last sent to: that replica gets the prefix bonus for a request with the same ``prefix_key``
    unless it is saturated. With ``config.placement`` a baseline, that rule chooses instead
    (``placement.least_loaded``; ``placement.hashed`` of ``request_id``, which it then requires)."""
    if config.placement is PlacementRule.LEAST_LOADED:
        return least_loaded([load for load in loads if accepts(load, kv_tokens, standing, config, priority)])
    if config.placement is PlacementRule.RANDOM:
        if request_id is None:
            raise ValueError("placement 'random' hashes the request id: pass request_id")
        passing = [load for load in loads if accepts(load, kv_tokens, standing, config, priority)]
        return hashed(passing, request_id)
    preferred = affinity.get(prefix_key) if affinity is not None and prefix_key is not None else None
    scored: list[tuple[float, ReplicaLoad]] = []
    for load in loads:
        if not accepts(load, kv_tokens, standing, config, priority):
            continue
        hit = load.replica_id == preferred and not saturated(
            load, config.saturation_kv_used_fraction, config.max_waiting_per_replica
        )
        value = score(load, hit, config.weights, config.itl_target_ms, config.max_waiting_per_replica)
        scored.append((value, load))
    return best(scored)
