"""Block accounting under any interleaving of add / abort / step (finish, preempt), with no model tensors.

The scheduler and block pool are real; the model runner is replaced by a fake that samples a fixed token,
as in vLLM's scheduler tests.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from cpu_engine.block_pool import BlockPool
from cpu_engine.config import EngineConfig
from cpu_engine.sampling import SamplingParams
from cpu_engine.scheduler import Scheduler
from cpu_engine.sequence import Sequence, SequenceStatus
from sluice.wire import EnginePriority, FinishReason

BLOCK = 4


def make_scheduler(num_blocks: int, budget: int = 16, prefix: bool = True) -> Scheduler:
    cfg = EngineConfig(
        block_size_tokens=BLOCK, num_kv_blocks=num_blocks, step_token_budget=budget, watermark_fraction=0.0
    )
    return Scheduler(
        cfg, BlockPool(num_blocks, BLOCK, prefix), max_model_len=256, eos_token_ids=frozenset({0})
    )


def fake_step(sched: Scheduler, token: int = 7) -> list[Sequence]:
    out = sched.schedule()
    sampled = {s.request_id: token for s, n in out.scheduled if s.num_computed_tokens + n == s.num_tokens}
    return sched.update_from_output(out, sampled)


def check_invariants(sched: Scheduler) -> None:
    pool = sched.block_pool
    refs = Counter(b for seq in sched.running for b in seq.block_table)
    for block_id in range(pool.num_blocks):
        assert pool.ref_counts[block_id] == refs.get(block_id, 0), f"block {block_id} refcount drift"
    assert pool.num_free_blocks == sum(1 for r in pool.ref_counts if r == 0)
    for seq in sched.running:
        assert len(seq.block_table) >= pool.blocks_for_tokens(seq.num_computed_tokens)
        assert len(set(seq.block_table)) == len(seq.block_table)
    for queue in sched.waiting.values():
        for seq in queue:
            assert not seq.block_table and seq.num_computed_tokens == 0


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.lists(st.integers(1, 3), min_size=1, max_size=14),  # tiny vocab: prefixes collide often
            st.integers(1, 8),
            st.sampled_from(["acme", "globex"]),
            st.sampled_from(list(EnginePriority)),
        ),
        st.tuples(st.just("abort"), st.integers(0, 40)),
        st.tuples(st.just("step")),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(8, 24), prefix=st.booleans())
def test_no_leak_under_any_interleaving(ops, num_blocks, prefix) -> None:
    sched = make_scheduler(num_blocks, prefix=prefix)
    added: list[Sequence] = []
    for op in ops:
        if op[0] == "add":
            _, prompt, max_tokens, scope, priority = op
            seq = Sequence(
                f"r{len(added)}",
                prompt,
                SamplingParams(max_tokens=max_tokens, temperature=0),
                priority,
                scope,
            )
            sched.add(seq)
            added.append(seq)
        elif op[0] == "abort" and added:
            seq = added[op[1] % len(added)]
            was_live = not seq.is_finished
            assert (sched.abort(seq.request_id) is not None) == was_live
            # A cancelled sequence's blocks are free at once, i.e. before the next step runs.
            assert not seq.block_table and seq.is_finished
        else:
            fake_step(sched)
        check_invariants(sched)
    # Drain: everything finishes or was aborted, and every block comes back.
    for _ in range(500):
        if not sched.has_unfinished():
            break
        fake_step(sched)
        check_invariants(sched)
    assert not sched.has_unfinished()
    assert sched.block_pool.num_used_blocks == 0
    assert all(s.is_finished for s in added)


def test_preemption_recomputes_and_never_fails() -> None:
    sched = make_scheduler(num_blocks=6, budget=32)
    # Each needs 2 blocks at admission but grows to 4: the pool runs short and must preempt.
    seqs = [
        Sequence(f"r{i}", [1, 2, 3, 4, 5], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
        for i in range(3)
    ]
    for s in seqs:
        sched.add(s)
    for _ in range(200):
        if not sched.has_unfinished():
            break
        fake_step(sched)
        check_invariants(sched)
    assert sched.num_preemptions_total > 0
    assert all(s.finish_reason is FinishReason.LENGTH and s.num_output_tokens == 10 for s in seqs)


def test_victim_is_lowest_priority_then_newest() -> None:
    # 5 blocks: both fit at admission (3 each reserved against what is free then) but not at full length.
    sched = make_scheduler(num_blocks=5, budget=64)
    a = Sequence("interactive", [1] * 4, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    b = Sequence(
        "batch", [2] * 4, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), EnginePriority.BATCH
    )
    sched.add(b)
    fake_step(sched)
    sched.add(a)
    while not sched.num_preemptions_total and a.status is not SequenceStatus.FINISHED:
        fake_step(sched)
    # The batch sequence goes although it is the older one.
    assert b.num_preemptions == 1 and a.num_preemptions == 0


def test_prefix_hits_within_a_tenant_never_across() -> None:
    sched = make_scheduler(num_blocks=32, budget=64)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    first = Sequence("a1", prompt, SamplingParams(max_tokens=1, temperature=0), cache_scope="acme")
    sched.add(first)
    fake_step(sched)
    assert first.is_finished
    other_tenant = Sequence("g1", prompt, SamplingParams(max_tokens=1, temperature=0), cache_scope="globex")
    same_tenant = Sequence("a2", prompt, SamplingParams(max_tokens=1, temperature=0), cache_scope="acme")
    assert sched.block_pool.find_cached_prefix(other_tenant) == []
    assert len(sched.block_pool.find_cached_prefix(same_tenant)) == 2
    sched.add(other_tenant)
    sched.add(same_tenant)
    fake_step(sched)
    assert other_tenant.num_cached_prompt_tokens == 0
    assert same_tenant.num_cached_prompt_tokens == 8


def test_full_prompt_hit_copies_the_shared_last_block() -> None:
    sched = make_scheduler(num_blocks=32, budget=64)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]  # exactly two blocks
    holder = Sequence("holder", prompt, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    sched.add(holder)
    fake_step(sched)
    fake_step(sched)  # holder keeps its blocks (still running)
    twin = Sequence("twin", prompt, SamplingParams(max_tokens=1, temperature=0))
    sched.add(twin)
    out = sched.schedule()
    assert twin.num_cached_prompt_tokens == 7  # the last token is recomputed for its logits
    assert len(out.block_copies) == 1
    src, dst = out.block_copies[0]
    assert src == holder.block_table[1] and dst == twin.block_table[1]
    assert twin.block_table[0] == holder.block_table[0]  # the first block stays shared
