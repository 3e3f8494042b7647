"""Engine statistics for the router, shaped like the TensorRT-LLM backend's Prometheus families.

``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|fraction}`` and
``nv_trt_llm_request_metrics{request_type=active|scheduled|context|waiting|max}`` read the same for both
engines, so one dispatcher reads either.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

KV_CACHE_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
REQUEST_FAMILY = "nv_trt_llm_request_metrics"
# A gauge that is always 1, labelled with the engine's dtype and the CPU flags it was chosen from.
ENGINE_INFO_FAMILY = "sluice_engine_info"


class StepTimeHistogram:
    """Cumulative-free histogram of step durations in milliseconds (bucket i counts ms <= bounds[i])."""

    def __init__(self, bounds_ms: tuple[float, ...]) -> None:
        self.bounds_ms = bounds_ms
        self.counts = [0] * (len(bounds_ms) + 1)  # the last bucket is +Inf
        self.sum_ms = 0.0
        self.count = 0

    def observe(self, ms: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_ms, ms)] += 1
        self.sum_ms += ms
        self.count += 1

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the q-quantile (inf if it is the overflow bucket)."""
        if self.count == 0:
            return 0.0
        rank = q * self.count
        seen = 0
        for bound, n in zip((*self.bounds_ms, float("inf")), self.counts, strict=True):
            seen += n
            if seen >= rank:
                return bound
        return float("inf")


@dataclass(frozen=True)
class EngineStats:
    """A consistent snapshot, taken by the engine thread between steps."""

    num_blocks_max: int
    num_blocks_used: int
    num_blocks_free: int
    tokens_per_block: int
    num_running: int
    num_waiting: int
    num_scheduled: int  # sequences in the last step
    num_context: int  # of which were prefilling
    running_cap: int  # current adaptive cap on running sequences
    num_preemptions_total: int
    num_steps_total: int
    num_generated_tokens_total: int
    num_prefix_query_tokens_total: int
    num_prefix_hit_tokens_total: int
    step_ms_bounds: tuple[float, ...] = ()
    step_ms_counts: tuple[int, ...] = field(default=())
    step_ms_sum: float = 0.0
    dtype: str = ""  # the number format the engine runs in ("float32" or "bfloat16")
    cpu_flags: str = ""  # the CPU flags that choice was based on (DTypeChoice.cpu_flags_label)

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.num_prefix_query_tokens_total
        return self.num_prefix_hit_tokens_total / q if q else 0.0

    def kv_cache_block_metrics(self) -> dict[str, float]:
        return {
            "max": self.num_blocks_max,
            "free": self.num_blocks_free,
            "used": self.num_blocks_used,
            "tokens_per": self.tokens_per_block,
            "fraction": self.num_blocks_used / self.num_blocks_max if self.num_blocks_max else 0.0,
        }

    def request_metrics(self) -> dict[str, float]:
        return {
            "active": self.num_running + self.num_waiting,
            "scheduled": self.num_scheduled,
            "context": self.num_context,
            "waiting": self.num_waiting,
            "max": self.running_cap,
        }
