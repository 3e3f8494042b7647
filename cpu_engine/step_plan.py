"""What one engine step does, as the scheduler builds it: the sequences it computes (``SchedulerOutput``),
and the token budget it builds it under (``StepBudget``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cpu_engine.sequence import Sequence


@dataclass
class SchedulerOutput:
    """The work of one step: (sequence, number of tokens to compute) pairs and KV block copies."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_preempted: int = 0
    num_preempted_for_priority: int = 0  # of num_preempted: to admit a higher class, not for memory

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def unschedule(self, seq: Sequence, budget: StepBudget) -> None:
        """Take ``seq`` out of this step if it was scheduled, handing its tokens back to ``budget``."""
        for i, (scheduled, num_new) in enumerate(self.scheduled):
            if scheduled is seq:
                del self.scheduled[i]
                budget.give_back(num_new, seq.in_prefill)
                return


@dataclass
class StepBudget:
    """Tokens one step may still take: ``num_tokens`` of any kind, ``num_prefill_tokens`` of them for
    prefill chunks (the step's prefill share, set once the decodes are scheduled).

    A victim taken out of the step hands its tokens back to both, if they were a prefill chunk."""

    num_tokens: int
    num_prefill_tokens: int = 0

    def available(self, prefill: bool) -> int:
        return min(self.num_tokens, self.num_prefill_tokens) if prefill else self.num_tokens

    def take(self, num_new: int, prefill: bool) -> None:
        self.num_tokens -= num_new
        if prefill:
            self.num_prefill_tokens -= num_new

    def give_back(self, num_returned: int, prefill: bool) -> None:
        self.take(-num_returned, prefill)
