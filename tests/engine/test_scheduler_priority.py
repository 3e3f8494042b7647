"""Preemption to admit a higher priority class: a real scheduler and block pool, no model tensors, fake
runner outputs (vLLM's scheduler-test shape)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cpu_engine.block_pool import BlockPool
from cpu_engine.config import EngineConfig
from cpu_engine.preemption import PRIORITY_GRACE_TOKENS
from cpu_engine.sampling import SamplingParams
from cpu_engine.scheduler import Scheduler
from cpu_engine.sequence import Sequence, SequenceStatus
from sluice.wire import EnginePriority
from tests.engine.test_block_accounting import check_invariants, fake_step

BLOCK = 4


def make_scheduler(num_blocks: int = 64, max_num_running: int = 2, budget: int = 64) -> Scheduler:
    cfg = EngineConfig(
        block_size_tokens=BLOCK,
        num_kv_blocks=num_blocks,
        step_token_budget=budget,
        max_num_running=max_num_running,
        watermark_fraction=0.0,
    )
    return Scheduler(cfg, BlockPool(num_blocks, BLOCK), max_model_len=256, eos_token_ids=frozenset({0}))


def seq(request_id: str, priority: EnginePriority, prompt_len: int = 6, max_tokens: int = 50) -> Sequence:
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return Sequence(
        request_id, [1 + i % 5 for i in range(prompt_len)], params, priority, cache_scope=request_id
    )


def running_ids(sched: Scheduler) -> set[str]:
    return {s.request_id for s in sched.running}


def test_higher_class_preempts_the_newest_of_the_lowest_class_when_the_cap_is_full() -> None:
    sched = make_scheduler(max_num_running=3)
    old_batch, over, new_batch = (
        seq("old-batch", EnginePriority.BATCH),
        seq("over", EnginePriority.OVER_SHARE),
        seq("new-batch", EnginePriority.BATCH),
    )
    for s in (old_batch, over, new_batch):
        sched.add(s)
    fake_step(sched)
    fake_step(sched)
    assert running_ids(sched) == {"old-batch", "over", "new-batch"}
    sched.add(seq("acme", EnginePriority.UNDER_SHARE))
    out = sched.schedule()
    assert out.num_preempted == out.num_preempted_for_priority == 1
    assert new_batch.status is SequenceStatus.WAITING and new_batch.block_table == []
    assert running_ids(sched) == {"old-batch", "over", "acme"}
    assert all(s is not new_batch for s, _ in out.scheduled)  # its decode left the step
    check_invariants(sched)


def test_equal_class_never_preempts() -> None:
    sched = make_scheduler(max_num_running=2)
    for name in ("a", "b"):
        sched.add(seq(name, EnginePriority.OVER_SHARE))
    fake_step(sched)
    sched.add(seq("c", EnginePriority.OVER_SHARE))
    for _ in range(5):
        out = sched.schedule()
        assert out.num_preempted == 0
        sched.update_from_output(out, {s.request_id: 7 for s, _ in out.scheduled})
    assert running_ids(sched) == {"a", "b"}
    assert [s.request_id for s in sched.waiting[EnginePriority.OVER_SHARE]] == ["c"]


def test_a_lower_class_never_preempts_a_higher_one() -> None:
    sched = make_scheduler(max_num_running=1)
    sched.add(seq("acme", EnginePriority.UNDER_SHARE))
    fake_step(sched)
    sched.add(seq("batch", EnginePriority.BATCH))
    out = sched.schedule()
    assert out.num_preempted == 0 and running_ids(sched) == {"acme"}


def test_kv_shortage_preempts_lower_classes_only_when_that_makes_room() -> None:
    # 16 blocks of 4 tokens. Each batch sequence: a 12-token prompt, then decodes into its 4th block.
    sched = make_scheduler(num_blocks=16, max_num_running=8)
    for i in range(4):
        sched.add(seq(f"b{i}", EnginePriority.BATCH, prompt_len=12, max_tokens=4))
    fake_step(sched)
    fake_step(sched)
    assert len(sched.running) == 4 and sched.block_pool.num_free_blocks == 0
    # Needs 6 + 10 tokens = 4 blocks: the newest batch sequence's 4 blocks make room, and only it goes.
    sched.add(seq("acme", EnginePriority.UNDER_SHARE, max_tokens=10))
    out = sched.schedule()
    assert out.num_preempted == out.num_preempted_for_priority == 1
    assert running_ids(sched) == {"b0", "b1", "b2", "acme"}
    check_invariants(sched)
    # 60 tokens = 15 blocks: every batch sequence together holds 12, so nobody is preempted for it.
    sched.add(seq("huge", EnginePriority.UNDER_SHARE, prompt_len=40, max_tokens=20))
    out = sched.schedule()
    assert out.num_preempted == 0 and "acme" in running_ids(sched)


def test_a_victim_makes_progress_before_it_can_be_preempted_for_priority_again() -> None:
    sched = make_scheduler(max_num_running=1, budget=64)
    victim = seq("batch", EnginePriority.BATCH, max_tokens=100)
    sched.add(victim)
    fake_step(sched)
    sched.add(seq("a0", EnginePriority.UNDER_SHARE, max_tokens=1))
    fake_step(sched)  # a0 preempts the batch sequence, runs its one token and finishes
    assert victim.num_preemptions == 1
    fake_step(sched)  # the batch sequence comes back (recompute) and makes a token
    assert victim.status is SequenceStatus.RUNNING
    num_tokens_back = victim.num_tokens
    sched.add(seq("a1", EnginePriority.UNDER_SHARE, max_tokens=1))
    while victim.num_tokens < victim.protected_until_num_tokens:
        out = sched.schedule()
        assert out.num_preempted == 0  # protected: a1 waits
        sched.update_from_output(out, {s.request_id: 7 for s, _ in out.scheduled})
    assert victim.num_tokens - num_tokens_back == PRIORITY_GRACE_TOKENS - 1
    out = sched.schedule()
    assert out.num_preempted_for_priority == 1 and running_ids(sched) == {"a1"}


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.lists(st.integers(1, 3), min_size=1, max_size=14),
            st.integers(1, 8),
            st.sampled_from(list(EnginePriority)),
        ),
        st.tuples(st.just("abort"), st.integers(0, 40)),
        st.tuples(st.just("step")),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(8, 24), max_num_running=st.integers(1, 4))
def test_no_leak_and_no_inversion_under_priority_preemption(ops, num_blocks, max_num_running) -> None:
    sched = make_scheduler(num_blocks, max_num_running=max_num_running, budget=16)
    added: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, prompt, max_tokens, priority = op
            s = Sequence(
                f"r{len(added)}",
                prompt,
                SamplingParams(max_tokens=max_tokens, temperature=0),
                priority,
                cache_scope="acme" if priority is EnginePriority.UNDER_SHARE else "globex",
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
            before = {s.request_id: s.priority for s in sched.running}
            out = sched.schedule()
            for queue in sched.waiting.values():
                for victim in queue:
                    # A sequence preempted for priority was always of a lower class than one admitted.
                    if victim.request_id in before and out.num_preempted_for_priority:
                        assert any(r.priority < victim.priority for r in sched.running)
            sampled = {s.request_id: 7 for s, n in out.scheduled if s.num_computed_tokens + n == s.num_tokens}
            sched.update_from_output(out, sampled)
        check_invariants(sched)
        assert len(sched.running) <= max(max_num_running, 1)
    for _ in range(400):
        if not sched.has_unfinished():
            break
        fake_step(sched)
    assert not sched.has_unfinished()
    assert sched.block_pool.num_free_blocks == num_blocks
