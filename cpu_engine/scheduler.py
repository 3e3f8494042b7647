"""Decides, before every step, which sequences run and how many tokens each computes.

One step = decode tokens for running sequences + prefill chunks, all under one token budget. Decodes are
served first (so a long prompt never stalls the batch); prefill chunks then take the step's prefill share
(``prefill_token_budget``: the whole rest of the budget while nothing decodes, less when a bigger step
would delay every stream's next token), class by class: running prefills, then waiting sequences, admitted
while the KV pool can hold their prompt + max_tokens. When blocks run short mid-flight, a running sequence
is preempted: its blocks are freed and it is recomputed later (mostly from the prefix cache).

Priority classes (``EnginePriority``, lower value first): waiting sequences are admitted class by class, and
a waiting sequence that finds the running cap or the KV pool full preempts running sequences of a strictly
lower class if that makes room for it. Which sequences give way, in which order, is
``cpu_engine/preemption.py``; what a step carries and the budget it is built under, ``step_plan.py``.
"""

from __future__ import annotations

from collections import deque

from cpu_engine.block_pool import BlockPool
from cpu_engine.config import EngineConfig
from cpu_engine.preemption import memory_victim, priority_victims, protect_after_priority_preemption
from cpu_engine.prefill_budget import StepCostModel, prefill_token_budget
from cpu_engine.sequence import Sequence, SequenceStatus
from cpu_engine.step_plan import SchedulerOutput, StepBudget
from sluice.wire import EnginePriority, FinishReason


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
        self.waiting: dict[EnginePriority, deque[Sequence]] = {p: deque() for p in EnginePriority}
        self.running: list[Sequence] = []
        self.num_watermark_blocks = int(config.watermark_fraction * block_pool.num_blocks)
        # Adaptive batch size: the engine lowers this when steps run over the latency target.
        self.running_cap = config.max_num_running
        # Step costs learned from measured steps (the engine feeds it), for the prefill share of a step.
        self.step_costs = StepCostModel()
        self.num_preemptions_total = 0
        self._num_admitted = 0

    # ----- queue -----
    def add(self, seq: Sequence) -> None:
        total = seq.num_tokens + seq.params.max_tokens * seq.params.n
        if self.block_pool.blocks_for_tokens(min(total, self.max_model_len)) > self.block_pool.num_blocks:
            raise ValueError(
                f"request {seq.request_id} needs more KV blocks than the pool holds "
                f"({seq.num_tokens} prompt + {seq.params.max_tokens} output tokens)"
            )
        if seq.num_tokens >= self.max_model_len:
            raise ValueError(f"prompt of {seq.num_tokens} tokens reaches the model's {self.max_model_len}")
        self.waiting[seq.priority].append(seq)

    def abort(self, key: str) -> Sequence | None:
        """Remove a sequence (by its key) wherever it is and free its blocks, with the siblings still
        waiting on it. Returns it, or None if unknown."""
        for queue in self.waiting.values():
            for seq in queue:
                if seq.key == key:
                    queue.remove(seq)
                    self._finish(seq, FinishReason.ABORT)
                    return seq
        for seq in self.running:
            if seq.key == key:
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
        budget = StepBudget(self.config.step_token_budget)
        # Decodes first (one token each): the batch keeps moving every step.
        ordered = sorted(self.running, key=lambda s: (s.in_prefill, s.priority, s.admitted_order))
        for seq in ordered:
            if not seq.in_prefill:
                self._schedule_running(seq, budget, out)
        num_decode = len(out.scheduled)
        budget.num_prefill_tokens = prefill_token_budget(
            num_decode_tokens=num_decode,
            num_prompt_sequences=self._num_prompt_sequences(out, num_decode),
            num_tokens_left=budget.num_tokens,
            stretch=self.config.prefill_step_stretch,
            min_prefill_tokens=self.config.block_size_tokens,
            costs=self.step_costs.costs(),
            fill_to_ms=self.config.target_step_ms,  # a step may take its target (prefill_budget, NOTE 1)
        )
        # Then prefill class by class: a class's running prefills, then its waiting sequences, so a
        # higher class's prompt never waits behind a lower class's chunks when the prefill share is small.
        admitting = out.num_preempted == 0  # after a preemption for memory, admit nothing new this step
        for priority in EnginePriority:
            for seq in ordered:
                if seq.in_prefill and seq.priority is priority:
                    self._schedule_running(seq, budget, out)
            if admitting:
                admitting = self._admit(self.waiting[priority], out, budget)
        for seq, num_new in out.scheduled:
            if seq.num_tokens - seq.num_computed_tokens > 1:
                out.num_prefill_tokens += num_new
            else:
                out.num_decode_tokens += num_new
        out.block_copies = self.block_pool.pending_copies
        self.block_pool.pending_copies = []
        return out

    def update_from_output(self, out: SchedulerOutput, sampled: dict[str, int]) -> list[Sequence]:
        """Advance the scheduled sequences; append sampled tokens (forking the siblings waiting on a
        prompt that was just computed); return the sequences that finished."""
        finished: list[Sequence] = []
        for seq, num_new in out.scheduled:
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens += num_new
            self.block_pool.cache_full_blocks(seq)
            if seq.key not in sampled:
                continue  # a prefill chunk that did not reach the end of the prompt
            siblings, seq.siblings = seq.siblings, []
            for member in (seq, *siblings):
                if member is not seq:
                    self._fork(seq, member)
                token = sampled[member.key]
                member.token_ids.append(token)
                reason = self._stop_reason(member, token)
                if reason is not None:
                    self.running.remove(member)
                    self._finish(member, reason)
                    finished.append(member)
        return finished

    def _fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` (an answer of ``parent``'s prompt) runs from here on ``parent``'s computed blocks: the
        full ones shared, the last partial one copied when either writes to it (copy-on-write)."""
        self.block_pool.share(parent, child)
        child.num_cached_prompt_tokens = parent.num_cached_prompt_tokens
        child.prompt_logprobs = parent.prompt_logprobs
        child.status = SequenceStatus.RUNNING
        child.admitted_order = self._num_admitted
        self._num_admitted += 1
        self.running.append(child)

    # ----- internals -----
    def _num_prompt_sequences(self, out: SchedulerOutput, num_decode: int) -> int:
        """Sequences in prefill or waiting, of a class at least as high as the highest decoding now (up to
        the running cap): the prompts that may widen the prefill share.

        NOTE: a flood of lower-class prompts must not buy a bigger share at the expense of a higher
        class's streams; prompts of the decoders' own class or above may."""
        if num_decode == 0:
            return 0
        top = min(seq.priority for seq, _ in out.scheduled)
        # NOTE: a prompt counts once per answer waiting on it (n > 1): each is a stream owed a first token.
        num_waiting = sum(1 + len(s.siblings) for p in EnginePriority if p <= top for s in self.waiting[p])
        num_prefilling = sum(1 + len(s.siblings) for s in self.running if s.in_prefill and s.priority <= top)
        return max(0, min(num_waiting + num_prefilling, self.running_cap - num_decode))

    def _schedule_running(self, seq: Sequence, budget: StepBudget, out: SchedulerOutput) -> None:
        """Schedule running ``seq``'s next chunk (its decode token, or a prefill chunk within the step's
        prefill share), preempting for memory if it must."""
        if seq.status is not SequenceStatus.RUNNING:
            return  # a victim earlier in this step
        num_new = min(seq.num_tokens - seq.num_computed_tokens, budget.available(seq.in_prefill))
        if num_new == 0:
            return
        self._make_room(seq, num_new, out, budget)
        if seq.status is not SequenceStatus.RUNNING:
            return  # seq itself was the victim
        self.block_pool.allocate(seq, num_new)
        out.scheduled.append((seq, num_new))
        budget.take(num_new, seq.in_prefill)

    def _admit(self, queue: deque[Sequence], out: SchedulerOutput, budget: StepBudget) -> bool:
        """Admit from the head of ``queue`` while the step's prefill share and the KV pool allow. False
        when its head cannot be admitted at all: later arrivals (of any class) must not overtake it."""
        while queue and budget.available(prefill=True) > 0:
            seq = queue[0]
            # NOTE: a prompt whose log-probabilities are asked is computed whole (its cached part has none).
            cached = [] if seq.wants_prompt_logprobs else self.block_pool.find_cached_prefix(seq)
            remaining_output = seq.params.max_tokens - seq.num_output_tokens
            # NOTE: the siblings waiting on it run from its prompt's blocks: only their output is extra.
            reserved = min(seq.num_tokens + remaining_output, self.max_model_len)
            reserved += remaining_output * len(seq.siblings)
            if not self._has_room(cached, reserved, 0, 0) and not self._preempt_for(
                seq, cached, reserved, out, budget
            ):
                return False  # head-of-line: later arrivals must not overtake a big request forever
            self.block_pool.admit(seq, cached)
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget.available(seq.in_prefill))
            if not self.block_pool.can_allocate(seq, num_new):
                self.block_pool.free(seq)
                return False
            queue.popleft()
            self.block_pool.allocate(seq, num_new)
            seq.status = SequenceStatus.RUNNING
            seq.admitted_order = self._num_admitted
            self._num_admitted += 1
            self.running.append(seq)
            out.scheduled.append((seq, num_new))
            budget.take(num_new, seq.in_prefill)
        return True

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
        self,
        seq: Sequence,
        cached: list[int],
        num_reserved_tokens: int,
        out: SchedulerOutput,
        budget: StepBudget,
    ) -> bool:
        """Preempt running sequences of a strictly lower class than waiting ``seq`` (lowest class, then
        most recently admitted, first) until ``seq`` fits (True), or nothing (False) if even every
        eligible victim would not make room. Victims hand their step tokens back to ``budget``.

        NOTE: only blocks a victim holds alone count as freed, and blocks of ``seq``'s own prefix hits
        not at all (freeing one revives it), so the estimate never promises room that is not there."""
        eligible = priority_victims(self.running, seq)
        hits = set(cached)
        ref_counts = self.block_pool.ref_counts
        victims: list[Sequence] = []
        num_freed = 0
        while not self._has_room(cached, num_reserved_tokens, len(victims), num_freed):
            if len(victims) == len(eligible):
                return False
            victim = eligible[len(victims)]
            victims.append(victim)
            num_freed += sum(1 for b in victim.block_table if ref_counts[b] == 1 and b not in hits)
        for victim in victims:
            out.unschedule(victim, budget)
            self._preempt(victim, out)
            protect_after_priority_preemption(victim)
            out.num_preempted_for_priority += 1
        return True

    def _make_room(self, seq: Sequence, num_new: int, out: SchedulerOutput, budget: StepBudget) -> None:
        """Preempt until ``seq`` can write ``num_new`` tokens; victims hand their tokens back to ``budget``.

        The victim is ``memory_victim`` of the running sequences (``seq`` included). A victim already
        scheduled this step is taken out of the step.
        """
        while not self.block_pool.can_allocate(seq, num_new):
            victim = memory_victim(self.running)
            out.unschedule(victim, budget)
            self._preempt(victim, out)
            if victim is seq:
                break

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
        if seq.matcher is not None and seq.matcher.is_stopped():  # the guide is complete: nothing can follow
            return FinishReason.STOP
        if seq.num_output_tokens >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        self.block_pool.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if reason is FinishReason.ABORT:  # the answers waiting on its prompt go with it
            for sibling in seq.siblings:
                sibling.status, sibling.finish_reason = SequenceStatus.FINISHED, reason
            seq.siblings = []
