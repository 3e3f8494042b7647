"""What the policies know of one replica's load: its Triton metrics (``nv_trt_llm_kv_cache_block_metrics``,
``nv_trt_llm_request_metrics``; the simulator's replicas report the same fields) combined with what the
dispatcher handed over since. Shared by ``dispatch`` (the gate) and ``placement`` (the choice)."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.wire import EnginePriority


@dataclass(frozen=True)
class PriorityLoad:
    """A replica's requests of one engine priority that the dispatcher handed over and that have not ended."""

    num_in_flight: int = 0
    num_waiting: int = 0  # of which not started yet (no first token)
    kv_tokens: int = 0  # their prompt + max_tokens


@dataclass(frozen=True)
class ReplicaLoad:
    replica_id: str
    free_kv_tokens: int
    total_kv_tokens: int
    num_waiting: int
    num_running: int
    itl_ms: float | None  # recent inter-token latency (step time); None if not measured yet
    # Indexed by EnginePriority; empty: not known (nothing counts as preemptible).
    by_priority: tuple[PriorityLoad, ...] = ()
    # How many may run at once for the inter-token target (``batch_bound``); None: not bounded, and then
    # an ``itl_ms`` over the target alone holds new work back.
    running_cap: int | None = None

    def below(self, priority: EnginePriority) -> PriorityLoad:
        """The work of strictly lower priority than ``priority`` (which the engine preempts for it)."""
        lower = self.by_priority[priority + 1 :]
        return PriorityLoad(
            num_in_flight=sum(p.num_in_flight for p in lower),
            num_waiting=sum(p.num_waiting for p in lower),
            kv_tokens=sum(p.kv_tokens for p in lower),
        )
