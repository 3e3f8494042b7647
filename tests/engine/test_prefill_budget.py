"""The prefill share of a step: the pure decision, the cost fit, and the scheduler that applies them.

Costs are injected (no wall clock): every number below is exact in binary floating point, so no
assertion rests on a rounding tie.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cpu_engine.block_pool import BlockPool
from cpu_engine.config import EngineConfig
from cpu_engine.engine import LLMEngine
from cpu_engine.prefill_budget import StepCostModel, StepCosts, prefill_token_budget
from cpu_engine.sampling import SamplingParams
from cpu_engine.scheduler import Scheduler
from cpu_engine.sequence import Sequence
from cpu_engine.step_plan import SchedulerOutput
from sluice.wire import EnginePriority
from tests.engine.test_block_accounting import check_invariants, fake_step
from tests.engine.test_scheduler_priority import ops

# 1 ms a step, 1/8 ms a decode token, 1/16 ms a prefill token: 24 decodes take 4 ms.
COSTS = StepCosts(fixed_ms=1.0, per_decode_token_ms=0.125, per_prefill_token_ms=0.0625)
BLOCK = 16


def budget(
    num_decode: int,
    num_left: int = 512,
    stretch: float | None = 2.0,
    costs: StepCosts | None = COSTS,
    num_prompt: int = 0,
) -> int:
    return prefill_token_budget(
        num_decode_tokens=num_decode,
        num_prompt_sequences=num_prompt,
        num_tokens_left=num_left,
        stretch=stretch,
        min_prefill_tokens=BLOCK,
        costs=costs,
    )


def test_with_nothing_decoding_prefill_takes_the_whole_budget_left() -> None:
    assert budget(0, num_left=512) == 512
    assert budget(0, num_left=100, num_prompt=32) == 100


def test_without_a_stretch_or_costs_prefill_takes_the_whole_budget_left() -> None:
    assert budget(24, num_left=488, stretch=None) == 488
    assert budget(24, num_left=488, costs=None) == 488
    free = StepCosts(fixed_ms=1.0, per_decode_token_ms=0.125, per_prefill_token_ms=0.0)
    assert budget(24, num_left=488, costs=free) == 488  # a fit that finds prefill free decides nothing


def test_a_step_with_prefill_stays_within_the_stretch_of_a_decode_step() -> None:
    # 24 decodes: 4 ms. Stretch 2 allows 4 ms more: 64 prefill tokens; 1.5 allows 2 ms: 32.
    assert budget(24) == 64
    assert budget(24, stretch=1.5) == 32
    assert COSTS.step_ms(24, budget(24)) == 2.0 * COSTS.step_ms(24, 0)
    assert budget(24, stretch=3.0) == 128


def test_prompts_in_line_widen_the_share() -> None:
    # 4 decode (1.5 ms): alone, stretch 2 allows 1.5 ms more, 24 tokens.
    assert budget(4) == 24
    # 2 prompts in line: they decode next, the batch's decode step is 1.75 ms, so up to 3.5 ms: 32 tokens.
    assert budget(4, num_prompt=2) == 32
    # 8 prompts: up to 2 x 2.5 ms, and twice as many streams wait for a first token as for a next one,
    # so twice that extra time: (5 - 1.5) x 2 = 7 ms, 112 tokens.
    assert budget(4, num_prompt=8) == 112
    assert budget(4, num_prompt=28) == 512  # a wave of arrivals: the whole budget left


def test_the_floor_and_the_budget_left_bound_the_share() -> None:
    assert budget(24, stretch=1.0) == BLOCK  # no stretch at all: one block per step still
    assert budget(24, num_left=10, stretch=1.0) == 10  # never more than the budget left
    assert budget(24, num_left=40) == 40
    broken = StepCosts(fixed_ms=-10.0, per_decode_token_ms=0.125, per_prefill_token_ms=0.0625)
    assert budget(24, costs=broken) == BLOCK  # a fit predicting negative time: the floor holds


def _exact_fit(model: StepCostModel, costs: StepCosts, steps: list[tuple[int, int]]) -> None:
    for num_decode, num_prefill in steps:
        model.observe(num_decode, num_prefill, costs.step_ms(num_decode, num_prefill))


def test_the_cost_model_recovers_a_linear_step_time() -> None:
    model = StepCostModel(decay=0.99, min_num_steps=8)
    steps = [(d, p) for d in (0, 4, 16, 32) for p in (0, 16, 64, 128)][1:]  # the empty step never runs
    _exact_fit(model, COSTS, steps[:7])
    assert model.costs() is None  # too few steps yet
    _exact_fit(model, COSTS, steps[7:])
    fit = model.costs()
    assert fit is not None
    assert fit.fixed_ms == pytest.approx(1.0, abs=1e-3)
    assert fit.per_decode_token_ms == pytest.approx(0.125, abs=1e-4)
    assert fit.per_prefill_token_ms == pytest.approx(0.0625, abs=1e-4)


def test_full_steps_alone_split_the_cost_evenly_between_decode_and_prefill() -> None:
    # Every step holds 512 tokens: the data only says what 512 tokens cost; the prior splits it evenly.
    model = StepCostModel()
    even = StepCosts(fixed_ms=2.0, per_decode_token_ms=0.0625, per_prefill_token_ms=0.0625)
    _exact_fit(model, even, [(d, 512 - d) for d in (0, 8, 16, 24, 32, 40, 48, 56) * 4])
    fit = model.costs()
    assert fit is not None
    assert fit.per_decode_token_ms == pytest.approx(fit.per_prefill_token_ms, rel=1e-3)
    assert fit.step_ms(32, 480) == pytest.approx(34.0, rel=1e-3)


def test_the_cost_model_follows_a_change_in_costs() -> None:
    model = StepCostModel(decay=0.95)
    steps = [(d, p) for d in (8, 16, 24, 32) for p in (0, 32)] * 25
    _exact_fit(model, COSTS, steps)
    slower = StepCosts(fixed_ms=2.0, per_decode_token_ms=0.25, per_prefill_token_ms=0.125)
    _exact_fit(model, slower, steps)
    fit = model.costs()
    assert fit is not None and fit.per_prefill_token_ms == pytest.approx(0.125, rel=1e-2)


def test_a_stretch_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="prefill_step_stretch must be >= 1 or None"):
        EngineConfig(prefill_step_stretch=0.5)
    assert EngineConfig(prefill_step_stretch=None).prefill_step_stretch is None


# ----- the scheduler -----
class FixedCosts(StepCostModel):
    """A cost model that always answers ``costs``: the scheduler's view of a warmed-up engine."""

    def __init__(self, costs: StepCosts | None) -> None:
        super().__init__()
        self.fixed = costs

    def costs(self) -> StepCosts | None:
        return self.fixed


def make_scheduler(stretch: float | None = 2.0, costs: StepCosts | None = COSTS) -> Scheduler:
    cfg = EngineConfig(
        block_size_tokens=BLOCK,
        num_kv_blocks=512,
        step_token_budget=512,
        watermark_fraction=0.0,
        prefill_step_stretch=stretch,
    )
    sched = Scheduler(cfg, BlockPool(512, BLOCK), max_model_len=2048, eos_token_ids=frozenset({0}))
    sched.step_costs = FixedCosts(costs)
    return sched


def seq(request_id: str, prompt_len: int, priority: EnginePriority = EnginePriority.UNDER_SHARE) -> Sequence:
    params = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    return Sequence(request_id, [1 + i % 7 for i in range(prompt_len)], params, priority, request_id)


def decoding(sched: Scheduler, num: int, priority: EnginePriority = EnginePriority.UNDER_SHARE) -> None:
    for i in range(num):
        sched.add(seq(f"d{i}", 8, priority))
    fake_step(sched)  # all prompts in one step: nothing decoded yet, the whole budget
    assert all(not s.in_prefill for s in sched.running)


def chunks(out: SchedulerOutput) -> dict[str, int]:
    """The step's prefill chunks by request id."""
    return {s.request_id: n for s, n in out.scheduled if s.in_prefill}


def sampled(out: SchedulerOutput) -> dict[str, int]:
    """A fake runner: a token for every sequence whose chunk reaches its end."""
    return {s.request_id: 7 for s, n in out.scheduled if s.num_computed_tokens + n == s.num_tokens}


def test_prefill_chunks_shrink_while_sequences_decode() -> None:
    sched = make_scheduler()
    decoding(sched, 24)
    sched.add(seq("p0", 200))
    out = sched.schedule()
    # The batch is 25 (p0 decodes next): up to 2 x 4.125 ms, 4 of them for the decodes: 68 tokens.
    assert out.num_decode_tokens == 24 and out.num_prefill_tokens == 68 == chunks(out)["p0"]
    check_invariants(sched)


def test_without_a_stretch_prefill_fills_the_budget() -> None:
    sched = make_scheduler(stretch=None)
    decoding(sched, 24)
    sched.add(seq("p0", 1000))
    out = sched.schedule()
    assert out.num_prefill_tokens == 512 - 24


def test_a_prompt_alone_gets_the_whole_budget() -> None:
    sched = make_scheduler()
    sched.add(seq("p0", 1000))
    out = sched.schedule()
    assert out.num_prefill_tokens == 512


def test_lower_class_prompts_do_not_widen_the_share_of_higher_class_streams() -> None:
    for prompt_class, share in ((EnginePriority.BATCH, 24), (EnginePriority.UNDER_SHARE, 112)):
        sched = make_scheduler()
        decoding(sched, 4)
        for i in range(8):
            sched.add(seq(f"p{i}", 100, prompt_class))
        assert sched.schedule().num_prefill_tokens == share


def test_a_waiting_higher_class_prompt_takes_the_share_before_a_lower_class_prefill() -> None:
    sched = make_scheduler(stretch=1.0)  # the share is the floor: one block per step
    decoding(sched, 8, EnginePriority.BATCH)
    sched.add(seq("p-batch", 400, EnginePriority.BATCH))
    fake_step(sched)
    assert sched.running[-1].num_computed_tokens == BLOCK  # the batch prompt is in prefill
    sched.add(seq("p-chat", 40))
    expected = [{"p-chat": 16}, {"p-chat": 16}, {"p-chat": 8, "p-batch": 8}, {"p-batch": 16}]
    for want in expected:
        out = sched.schedule()
        assert chunks(out) == want
        assert out.num_decode_tokens >= 8  # the decodes never wait for either
        sched.update_from_output(out, sampled(out))
        check_invariants(sched)


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(8, 24), max_num_running=st.integers(1, 4))
def test_a_floor_share_holds_under_preemption_and_everything_finishes(
    ops, num_blocks, max_num_running
) -> None:
    # Decode tokens cost nothing here, so the share is exactly the floor (one 4-token block) whenever a
    # sequence decodes; preemptions (for memory and for priority) must never let a step exceed it.
    cfg = EngineConfig(
        block_size_tokens=4,
        num_kv_blocks=num_blocks,
        step_token_budget=16,
        max_num_running=max_num_running,
        watermark_fraction=0.0,
        prefill_step_stretch=1.0,
    )
    sched = Scheduler(cfg, BlockPool(num_blocks, 4), max_model_len=256, eos_token_ids=frozenset({0}))
    sched.step_costs = FixedCosts(
        StepCosts(fixed_ms=1.0, per_decode_token_ms=0.0, per_prefill_token_ms=0.0625)
    )
    added: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, prompt, max_tokens, priority = op
            s = Sequence(
                f"r{len(added)}", prompt, SamplingParams(max_tokens=max_tokens, temperature=0), priority
            )
            try:
                sched.add(s)
            except ValueError:
                continue
            added.append(s)
        elif op[0] == "abort":
            if added:
                sched.abort(added[op[1] % len(added)].request_id)
        else:
            was_decoding = {s.request_id for s in sched.running if not s.in_prefill}
            out = sched.schedule()
            if any(s.request_id in was_decoding for s, _ in out.scheduled):
                assert out.num_prefill_tokens <= 4
            sched.update_from_output(out, sampled(out))
        check_invariants(sched)
    for _ in range(2000):
        if not sched.has_unfinished():
            break
        fake_step(sched)
    assert not sched.has_unfinished()
    assert sched.block_pool.num_free_blocks == num_blocks


def test_the_engine_feeds_every_step_it_runs_to_the_cost_model(dev_checkpoint: Path) -> None:
    engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=128))
    seen: list[tuple[int, int]] = []

    class Recording(StepCostModel):
        def observe(self, num_decode_tokens: int, num_prefill_tokens: int, step_ms: float) -> None:
            seen.append((num_decode_tokens, num_prefill_tokens))

    engine.scheduler.step_costs = Recording()
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    engine.add_request("a", list(range(1, 21)), params)
    engine.add_request("b", list(range(30, 40)), params)
    while engine.has_unfinished():
        engine.step()
    assert seen == [(0, 30), (2, 0), (2, 0)]


def test_a_step_may_always_fill_up_to_the_step_target() -> None:
    """24 decodes take 4 ms and stretch 2 allows 4 ms more (64 tokens); filling to 10 ms allows 6 ms: 96.
    A bigger allowance from the stretch stands, and the budget left still bounds it."""
    fill = partial(prefill_token_budget, num_prompt_sequences=0, min_prefill_tokens=BLOCK, costs=COSTS)
    assert fill(num_decode_tokens=24, num_tokens_left=512, stretch=2.0, fill_to_ms=10.0) == 96
    assert fill(num_decode_tokens=24, num_tokens_left=512, stretch=2.0, fill_to_ms=6.0) == 64
    assert fill(num_decode_tokens=24, num_tokens_left=50, stretch=2.0, fill_to_ms=10.0) == 50
    assert fill(num_decode_tokens=24, num_tokens_left=512, stretch=2.0, fill_to_ms=2.0) == 64
