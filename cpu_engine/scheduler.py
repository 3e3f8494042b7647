"""Decides, before every step, which sequences run and how many tokens each computes.

One step = decode tokens for running sequences + prefill chunks, all under one token budget. Running
sequences are served first (so a long prompt never stalls the batch); waiting ones are admitted while the
KV pool can hold their prompt + max_tokens. When blocks run short mid-flight, the lowest-priority, most
recently admitted sequence is preempted: its blocks are freed and it is recomputed later.

Priority classes (``PriorityClass``, lower value first): waiting sequences are admitted class by class, and
a waiting sequence that finds the running cap or the KV pool full preempts running sequences of a strictly
LOWER class (lowest class, then most recently admitted, first) if that makes room for it. Equal classes
never preempt each other. A victim is recomputed when it comes back, mostly from the prefix cache; it is
then safe from this kind of preemption until it has made ``PRIORITY_GRACE_TOKENS`` new tokens, so a stream
of high-priority arrivals cannot keep one sequence recomputing forever.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from cpu_engine.block_pool import BlockPool
from cpu_engine.config import EngineConfig
from cpu_engine.sampling import PriorityClass
from cpu_engine.sequence import FinishReason, Sequence, SequenceStatus

# New tokens a sequence preempted to admit a higher class makes before it can be chosen for that again.
PRIORITY_GRACE_TOKENS = 8


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


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        block_pool: BlockPool,
        max_model_len: int,
        eos_token_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.config = config
        self.eos_token_ids = eos_token_ids
        self.block_pool = block_pool
        self.max_model_len = max_model_len
        self.waiting: dict[PriorityClass, deque[Sequence]] = {p: deque() for p in PriorityClass}
        self.running: list[Sequence] = []
        self.num_watermark_blocks = int(config.watermark_fraction * block_pool.num_blocks)
        # Adaptive batch size: the engine lowers this when steps run over the latency target.
        self.running_cap = config.max_num_running
        self.num_preemptions_total = 0
        self._num_admitted = 0

    # ----- queue -----
    def add(self, seq: Sequence) -> None:
        total = seq.num_tokens + seq.params.max_tokens
        if self.block_pool.blocks_for_tokens(min(total, self.max_model_len)) > self.block_pool.num_blocks:
            raise ValueError(
                f"request {seq.request_id} needs more KV blocks than the pool holds "
                f"({seq.num_tokens} prompt + {seq.params.max_tokens} output tokens)"
            )
        if seq.num_tokens >= self.max_model_len:
            raise ValueError(f"prompt of {seq.num_tokens} tokens reaches the model's {self.max_model_len}")
        self.waiting[seq.priority].append(seq)

    def abort(self, request_id: str) -> Sequence | None:
        """Remove a sequence wherever it is and free its blocks. Returns it, or None if unknown."""
        for queue in self.waiting.values():
            for seq in queue:
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self._finish(seq, FinishReason.ABORT)
                    return seq
        for seq in self.running:
            if seq.request_id == request_id:
                self.running.remove(seq)
                self._finish(seq, FinishReason.ABORT)
                return seq
        return None

    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    # ----- the two verbs -----
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.step_token_budget
        # Decode first (one token each), then running prefills by class: the batch keeps moving every step.
        ordered = sorted(self.running, key=lambda s: (s.in_prefill, s.priority, s.admitted_order))
        for seq in ordered:
            if seq.status is not SequenceStatus.RUNNING or budget == 0:
                continue
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            budget += self._make_room(seq, num_new, out)
            if seq.status is not SequenceStatus.RUNNING:
                continue  # seq itself was the victim
            self.block_pool.allocate(seq, num_new)
            out.scheduled.append((seq, num_new))
            budget -= num_new
        if out.num_preempted == 0:  # after a preemption for memory, admit nothing new this step
            self._admit(out, budget)
        for seq, num_new in out.scheduled:
            if seq.num_tokens - seq.num_computed_tokens > 1:
                out.num_prefill_tokens += num_new
            else:
                out.num_decode_tokens += num_new
        out.block_copies = self.block_pool.pending_copies
        self.block_pool.pending_copies = []
        return out

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Sequence]:
        """Advance the scheduled sequences; append sampled tokens; return the sequences that finished."""
        finished: list[Sequence] = []
        for seq, num_new in out.scheduled:
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens += num_new
            self.block_pool.cache_full_blocks(seq)
            token = sampled.get(seq.request_id)
            if token is None:
                continue  # a prefill chunk that did not reach the end of the prompt
            seq.token_ids.append(token)
            reason = self._stop_reason(seq, token)
            if reason is not None:
                self.running.remove(seq)
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    # ----- internals -----
    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        for priority in PriorityClass:
            queue = self.waiting[priority]
            while queue and budget > 0:
                seq = queue[0]
                cached = self.block_pool.find_cached_prefix(seq)
                remaining_output = seq.params.max_tokens - seq.num_output_tokens
                reserved = min(seq.num_tokens + remaining_output, self.max_model_len)
                if not self._has_room(cached, reserved, 0, 0):
                    returned = self._preempt_for(seq, cached, reserved, out)
                    if returned is None:
                        return  # head-of-line: later arrivals must not overtake a big request forever
                    budget += returned
                self.block_pool.admit(seq, cached)
                num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
                if not self.block_pool.can_allocate(seq, num_new):
                    self.block_pool.free(seq)
                    return
                queue.popleft()
                self.block_pool.allocate(seq, num_new)
                seq.status = SequenceStatus.RUNNING
                seq.admitted_order = self._num_admitted
                self._num_admitted += 1
                self.running.append(seq)
                out.scheduled.append((seq, num_new))
                budget -= num_new

    def _has_room(self, cached: list[int], num_reserved_tokens: int, num_fewer: int, num_freed: int) -> bool:
        """Whether a sequence with prefix hits ``cached`` and ``num_reserved_tokens`` fits under the running
        cap and in the KV pool, with ``num_fewer`` sequences fewer running and ``num_freed`` more blocks
        free (the same test as ``BlockPool.can_admit``)."""
        if len(self.running) - num_fewer >= self.running_cap:
            return False
        pool = self.block_pool
        num_needed = pool.blocks_for_tokens(num_reserved_tokens) - len(cached)
        num_revived = sum(1 for b in cached if pool.ref_counts[b] == 0)
        return pool.num_free_blocks + num_freed - num_revived - num_needed >= self.num_watermark_blocks

    def _preempt_for(
        self, seq: Sequence, cached: list[int], num_reserved_tokens: int, out: SchedulerOutput
    ) -> int | None:
        """Preempt running sequences of a strictly lower class than waiting ``seq`` (lowest class, then
        most recently admitted, first) until ``seq`` fits; the budget the victims hand back, or None
        (nothing preempted) if even every eligible victim would not make room.

        NOTE: only blocks a victim holds alone count as freed, and blocks of ``seq``'s own prefix hits
        not at all (freeing one revives it), so the estimate never promises room that is not there."""
        eligible = sorted(
            (
                s
                for s in self.running
                if s.priority > seq.priority and s.num_tokens >= s.protected_until_num_tokens
            ),
            key=lambda s: (s.priority, s.admitted_order),
            reverse=True,
        )
        hits = set(cached)
        ref_counts = self.block_pool.ref_counts
        victims: list[Sequence] = []
        num_freed = 0
        while not self._has_room(cached, num_reserved_tokens, len(victims), num_freed):
            if len(victims) == len(eligible):
                return None
            victim = eligible[len(victims)]
            victims.append(victim)
            num_freed += sum(1 for b in victim.block_table if ref_counts[b] == 1 and b not in hits)
        returned = 0
        for victim in victims:
            returned += self._unschedule(victim, out)
            self._preempt(victim, out)
            victim.protected_until_num_tokens = victim.num_tokens + PRIORITY_GRACE_TOKENS
            out.num_preempted_for_priority += 1
        return returned

    def _unschedule(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Take ``seq`` out of this step if it was scheduled; the budget it held."""
        for i, (scheduled, num_new) in enumerate(out.scheduled):
            if scheduled is seq:
                del out.scheduled[i]
                return num_new
        return 0

    def _make_room(self, seq: Sequence, num_new: int, out: SchedulerOutput) -> int:
        """Preempt until ``seq`` can write ``num_new`` tokens; returns the budget handed back by victims.

        The victim is the lowest-priority, most recently admitted running sequence (``seq`` included), so
        batch work always goes before interactive work. A victim already scheduled this step is taken out
        of the step.
        """
        returned = 0
        while not self.block_pool.can_allocate(seq, num_new):
            victim = max(self.running, key=lambda s: (s.priority, s.admitted_order))
            returned += self._unschedule(victim, out)
            self._preempt(victim, out)
            if victim is seq:
                break
        return returned

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_pool.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions_total += 1
        out.num_preempted += 1
        self.waiting[seq.priority].appendleft(seq)  # first in line to come back

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        p = seq.params
        if token in p.stop_token_ids:
            return FinishReason.STOP
        if not p.ignore_eos and token in self.eos_token_ids:
            return FinishReason.STOP
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.block_pool.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
