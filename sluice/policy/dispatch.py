"""Which replica may take the next request: gated on its KV headroom, its own waiting count and its
inter-token latency against a target, as its Triton metrics report them
(``nv_trt_llm_kv_cache_block_metrics``, ``nv_trt_llm_request_metrics``; the simulator's replicas report
the same fields).

- KV: a replica takes a request only if its free KV tokens cover the request's prompt + max_tokens (what
  the engine's own admission needs).
- Waiting: a replica with ``max_waiting_per_replica`` requests already waiting inside takes no more;
  they wait in the gateway's fair queue, where the order is decided.
- Latency: a replica whose recent inter-token latency is above the target takes nothing new until it
  drops (more sequences make every step longer).
- Work that yields meets softer limits, so the headroom above stays for interactive work of tenants
  under their share (``Standing``): batch needs the inter-token latency under ``batch_itl_fraction``
  of the target; a tenant over its fair share (``share.over_fair_share``), under the stricter
  ``over_share_itl_fraction``; both leave ``yield_kv_reserve_fraction`` of the KV free.
Among replicas that pass, the one with the most free KV tokens (then the fewest running) wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sluice.domain import RequestClass


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    free_kv_tokens: int
    total_kv_tokens: int
    num_waiting: int
    num_running: int
    itl_ms: float | None  # recent inter-token latency (step time); None if not measured yet


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

    def __post_init__(self) -> None:
        if self.itl_target_ms <= 0 or self.max_waiting_per_replica < 1:
            raise ValueError("itl_target_ms must be > 0 and max_waiting_per_replica >= 1")
        if not 0 <= self.yield_kv_reserve_fraction < 1:
            raise ValueError("yield_kv_reserve_fraction must be in [0, 1)")
        if not (0 < self.batch_itl_fraction <= 1 and 0 < self.over_share_itl_fraction <= 1):
            raise ValueError("batch_itl_fraction and over_share_itl_fraction must be in (0, 1]")

    def itl_limit_ms(self, standing: Standing) -> float:
        fraction = {
            Standing.UNDER_SHARE: 1.0,
            Standing.BATCH: self.batch_itl_fraction,
            Standing.OVER_SHARE: self.over_share_itl_fraction,
        }[standing]
        return self.itl_target_ms * fraction


def accepts(load: ReplicaLoad, kv_tokens: int, standing: Standing, config: DispatchConfig) -> bool:
    if load.num_waiting >= config.max_waiting_per_replica:
        return False
    if load.num_running > 0 and load.itl_ms is not None and load.itl_ms > config.itl_limit_ms(standing):
        return False
    yields = standing is not Standing.UNDER_SHARE
    reserve = config.yield_kv_reserve_fraction * load.total_kv_tokens if yields else 0.0
    return load.free_kv_tokens - reserve >= kv_tokens


def pick_replica(
    loads: Sequence[ReplicaLoad], kv_tokens: int, standing: Standing, config: DispatchConfig
) -> ReplicaLoad | None:
    """The replica to send a request of ``kv_tokens`` (prompt + max_tokens) to, or None: keep it queued."""
    best: ReplicaLoad | None = None
    for load in loads:
        if not accepts(load, kv_tokens, standing, config):
            continue
        if best is None or (load.free_kv_tokens, -load.num_running) > (
            best.free_kv_tokens,
            -best.num_running,
        ):
            best = load
    return best
