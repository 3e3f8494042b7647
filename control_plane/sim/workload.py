"""Simulated requests and the arrival processes that make them.

Sizes are fixed at the seed's mix (1 000 prompt, 300 output tokens) unless a stream says otherwise: the
seed sizes the fleet with exactly those means, so fixed sizes let the roofline bound and the simulated
capacity be compared directly (a spread would add variance, not change the token budget).

Arrivals are a Poisson process whose rate is modulated: every ``burst_period_s`` the rate is multiplied
by a fresh log-normal factor (mean 1, ``burst_sigma`` 0.25 by default, so a 5 s window runs about 25 %
above or below the mean one time in three). The mean stays at the seed's rate while the fleet sees the
second-scale bursts that make queues form; a plain Poisson stream at 280/s is too smooth to test them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from sluice.domain import Outcome, RequestClass
from sluice.stores.quota.base import QuotaGrant

SEED_RATE_PER_S = 280.0  # "1 M requests/hour at peak ÷ 3 600 s = ~280/s"
SEED_PROMPT_TOKENS = 1_000
SEED_OUTPUT_TOKENS = 300
# Interactive: 300 tokens x 40 ms = 12 s of decode at the ITL target, plus ~3 s for the queue and prefill
# (0.1 s at 10 k tokens/s); longer outputs get the same 3 s of slack on top of their decode time.
INTERACTIVE_SLACK_S = 3.0
BATCH_DEADLINE_S = 600.0


DEADLINE_AT_HEAD = "deadline_at_head"  # the reason of a request refused at the head of the queue


@dataclass(eq=False)
class SimRequest:
    request_id: str
    tenant_id: str
    request_class: RequestClass
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    deadline_s: float  # absolute
    weight: float = 1.0  # its tenant's
    # gateway side
    grant: QuotaGrant | None = None
    # The gateway's own (sluice.domain.Outcome): FINISHED, or REFUSED at admission (a quota or the queue's
    # depth, with a Retry-After) or at the head of the queue (``reason`` DEADLINE_AT_HEAD: its deadline
    # could no longer be met, no Retry-After); None: still queued or running when the run ended.
    outcome: Outcome | None = None
    reason: str = ""  # why it was refused
    retry_after_s: float | None = None
    dispatch_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    charged_tokens: int = 0  # output tokens charged to the fair queue so far
    priority: int = 0  # the engine priority its dispatch gave it (sluice.policy.dispatch.EnginePriority)
    # replica side
    prefilled_tokens: int = 0
    offset: int = 0  # context during decode step j is offset + j (see Replica)
    finish_step: int = 0
    num_output_before: int = 0  # output tokens made before its latest preemption (recomputed after it)
    num_preemptions: int = 0

    @property
    def kv_tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens

    @property
    def prefill_tokens(self) -> int:
        """Tokens to compute before it decodes: the prompt, plus its output so far after a preemption."""
        return self.prompt_tokens + self.num_output_before

    def num_output_at(self, num_steps: int) -> int:
        """Output tokens made once its replica has run ``num_steps`` steps (it is decoding there)."""
        joined_step = self.prefill_tokens - self.offset  # the step that emitted its latest first token
        return min(self.max_tokens, self.num_output_before + num_steps - joined_step)


def interactive_deadline_s(max_tokens: int, itl_target_s: float) -> float:
    return max_tokens * itl_target_s + INTERACTIVE_SLACK_S


@dataclass(frozen=True)
class Stream:
    """One arrival process: who sends what, at what mean rate, from when to when."""

    name: str
    tenant_ids: tuple[str, ...]  # each request picks one uniformly
    request_class: RequestClass
    rate_per_s: float
    start_s: float = 0.0
    end_s: float = math.inf
    prompt_tokens: int = SEED_PROMPT_TOKENS
    output_tokens: int = SEED_OUTPUT_TOKENS
    max_requests: int | None = None  # stop after this many (a burst of exactly N)
    burst_sigma: float = 0.25
    burst_period_s: float = 5.0
    # (time, multiplier) steps applied to rate_per_s, e.g. ((t, 2.0),) doubles the load from t on
    rate_steps: tuple[tuple[float, float], ...] = ()


class Arrivals:
    """Draws one stream's arrival times lazily from its own RNG (seeded from the run's seed)."""

    def __init__(self, stream: Stream, rng: random.Random) -> None:
        self.stream = stream
        self._rng = rng
        self._segment_end_s = stream.start_s
        self._rate = 0.0
        self._now_s = stream.start_s

    def _rate_at(self, t: float) -> float:
        multiplier = 1.0
        for at_s, factor in self.stream.rate_steps:
            if t >= at_s:
                multiplier = factor
        return self.stream.rate_per_s * multiplier

    def next_s(self) -> float | None:
        """The next arrival time, or None once the stream has ended."""
        s = self.stream
        while True:
            if self._now_s >= self._segment_end_s:
                sigma = s.burst_sigma
                factor = math.exp(self._rng.gauss(-sigma * sigma / 2, sigma)) if sigma > 0 else 1.0
                self._segment_end_s = self._now_s + s.burst_period_s
                self._rate = self._rate_at(self._now_s) * factor
            step_ends = [t for t, _ in s.rate_steps if self._now_s < t < self._segment_end_s]
            horizon = min([self._segment_end_s, *step_ends])
            gap = self._rng.expovariate(self._rate) if self._rate > 0 else math.inf
            if self._now_s + gap < horizon:
                self._now_s += gap
                return self._now_s if self._now_s < s.end_s else None
            # NOTE: exponential gaps are memoryless, so restarting the draw at a boundary is exact.
            self._now_s = horizon
            if step_ends:
                self._segment_end_s = horizon  # redraw the factor at the new base rate
            if self._now_s >= s.end_s:
                return None
