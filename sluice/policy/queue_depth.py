"""How deep a model's queue may get, and the Retry-After of a refusal: derived from the deadline and the
measured drain rate, never from memory (the seed: "a queue longer than the deadline is a mechanism for
wasting capacity").

A new request would wait about ``position / drain_rate`` seconds, where ``position`` is how many
waiting requests fair queueing would dispatch before it (``FairQueue.position``): a tenant far above its
share sees a deep position and is refused first, while a tenant under its share still gets in. If that
wait leaves no time to serve the request before its deadline, it is refused now, with a Retry-After of
the time the queue needs to drain to where the request would fit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueueRefusal:
    expected_wait_s: float
    max_wait_s: float
    retry_after_s: float  # > 0


@dataclass(frozen=True)
class QueueDepthConfig:
    # Before any dispatch was measured (a cold gateway), assume the queue drains at least this fast.
    min_drain_rate_per_s: float = 1.0
    min_retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        if self.min_drain_rate_per_s <= 0 or self.min_retry_after_s <= 0:
            raise ValueError("min_drain_rate_per_s and min_retry_after_s must be > 0")


def min_service_s(
    prompt_tokens: int, output_tokens: int, prefill_tokens_per_s: float, itl_target_ms: float
) -> float:
    """The least time a request needs once dispatched to produce ``output_tokens``: its prefill, then
    each further token at the inter-token latency target. The gateway asks for 1 (it must START before
    its deadline: generation is cut at the deadline, so a long max_tokens is a ceiling, not a promise);
    a caller that must FINISH by the deadline asks for max_tokens."""
    return prompt_tokens / prefill_tokens_per_s + output_tokens * itl_target_ms / 1000


def check_queue(
    position: int,
    drain_rate_per_s: float | None,
    now_s: float,
    deadline_s: float,
    min_service_s: float,
    config: QueueDepthConfig,
) -> QueueRefusal | None:
    """None to admit; a refusal if the expected queue wait leaves too little time before the deadline
    for ``min_service_s`` of service."""
    rate = max(drain_rate_per_s or 0.0, config.min_drain_rate_per_s)
    expected_wait_s = position / rate  # the requests ahead of it must leave first
    max_wait_s = deadline_s - now_s - min_service_s
    if expected_wait_s <= max_wait_s:
        return None
    # The queue must drain (expected - max) seconds' worth before this request would make it in time.
    retry_after_s = max(config.min_retry_after_s, expected_wait_s - max(max_wait_s, 0.0))
    return QueueRefusal(expected_wait_s, max_wait_s, retry_after_s)
