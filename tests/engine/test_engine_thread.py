"""The engine thread: streams, coalescing, cancellation within a step, stats, adaptive batch."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from cpu_engine.config import EngineConfig, prefill_num_threads_of
from cpu_engine.engine import LLMEngine
from cpu_engine.engine_thread import EngineThread, StreamDelta, StreamError
from cpu_engine.native import elementwise_ext
from cpu_engine.sampling import SamplingParams
from cpu_engine.thread_names import ENGINE_THREAD
from sluice.wire import EnginePriority, FinishReason


@pytest.fixture
def engine_thread(dev_checkpoint: Path):
    thread = EngineThread(LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=256)))
    yield thread
    thread.close()


def drain(stream, timeout_s: float = 30.0) -> list[StreamDelta]:
    deltas = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        delta = stream.take(timeout_s=1.0)
        if delta is None:
            continue
        deltas.append(delta)
        if delta.finished:
            return deltas
    raise AssertionError("stream did not finish")


def test_stream_delivers_every_token_once_and_finishes(engine_thread: EngineThread) -> None:
    stream = engine_thread.submit("a", list(range(10, 40)), SamplingParams(max_tokens=12, temperature=0))
    deltas = drain(stream)
    tokens = [t for d in deltas for t in d.token_ids]
    assert len(tokens) == 12
    assert deltas[-1].finish_reason is FinishReason.LENGTH
    assert deltas[-1].num_prompt_tokens == 30 and deltas[-1].num_output_tokens == 12
    assert stream.take(timeout_s=0.01) is None  # nothing after the final delta


def test_the_stepping_thread_carries_the_engines_kernel_name(engine_thread: EngineThread) -> None:
    """So `top -H`, py-spy and bench.cpu_split tell the engine's CPU from the send path's."""
    drain(engine_thread.submit("named", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0)))
    native_id = engine_thread._thread.native_id
    assert Path(f"/proc/self/task/{native_id}/comm").read_text().rstrip("\n") == ENGINE_THREAD


def test_slow_reader_gets_tokens_coalesced(engine_thread: EngineThread) -> None:
    stream = engine_thread.submit("slow", [5, 6, 7], SamplingParams(max_tokens=20, temperature=0))
    time.sleep(1.0)  # the engine runs ahead; tokens pile up in the stream, not as 20 messages
    delta = stream.take(timeout_s=5)
    assert delta is not None and len(delta.token_ids) > 1


def test_abort_frees_blocks_within_a_step(engine_thread: EngineThread) -> None:
    params = SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True)
    stream = engine_thread.submit("long", list(range(100, 300)), params)
    first = stream.take(timeout_s=10)
    assert first is not None and first.token_ids
    assert engine_thread.stats().num_blocks_used > 0
    engine_thread.abort("long")
    deltas = drain(stream, timeout_s=2)
    assert deltas[-1].finish_reason is FinishReason.ABORT
    deadline = time.monotonic() + 1.0
    while engine_thread.stats().num_blocks_used and time.monotonic() < deadline:
        time.sleep(0.005)
    stats = engine_thread.stats()
    assert stats.num_blocks_used == 0 and stats.num_running == 0
    assert stats.kv_cache_block_metrics()["used"] == 0
    assert stats.request_metrics()["active"] == 0


def test_bad_request_fails_its_stream_only(engine_thread: EngineThread) -> None:
    bad = engine_thread.submit("bad", [999_999], SamplingParams(max_tokens=2))
    delta = bad.take(timeout_s=5)
    assert delta is not None and delta.finished and delta.error and "prompt token ids" in delta.error
    assert delta.error_kind is StreamError.INVALID_REQUEST
    good = engine_thread.submit("good", [1, 2, 3], SamplingParams(max_tokens=2, temperature=0))
    assert drain(good)[-1].finish_reason is not None


def test_seeded_sampling_is_reproducible_whatever_shares_the_batch(dev_checkpoint: Path) -> None:
    def run(extra: int) -> list[int]:
        engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=128))
        params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
        engine.add_request("x", [3, 4, 5, 6], params)
        for i in range(extra):
            engine.add_request(f"n{i}", [7, 8, 9 + i], SamplingParams(max_tokens=16, temperature=1.0, seed=i))
        tokens: list[int] = []
        while engine.has_unfinished():
            tokens += [t for o in engine.step() if o.request_id == "x" for t in o.new_token_ids]
        return tokens

    assert run(0) == run(5)


def test_interactive_is_admitted_before_batch(dev_checkpoint: Path) -> None:
    engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=128, max_num_running=1))
    engine.add_request("batch", [1, 2, 3], SamplingParams(max_tokens=2, temperature=0), EnginePriority.BATCH)
    engine.add_request("chat", [1, 2, 4], SamplingParams(max_tokens=2, temperature=0))
    first = engine.step()
    assert [o.request_id for o in first] == ["chat"]


def test_adaptive_batch_caps_running_under_a_tight_target(dev_checkpoint: Path) -> None:
    # The cap gates admission: once decode steps are measured over the target, newcomers wait. (A 4-sequence
    # decode step of the dev model takes well under a millisecond: the target is far below any step.)
    cfg = EngineConfig(num_kv_blocks=512, target_step_ms=0.01, max_num_running=64)
    engine = LLMEngine.from_checkpoint(dev_checkpoint, cfg)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"early{i}", rng.integers(0, 8192, 16).tolist(), params)
    for _ in range(5):
        engine.step()
    for i in range(28):
        engine.add_request(f"late{i}", rng.integers(0, 8192, 16).tolist(), params)
    engine.step()
    stats = engine.stats()
    assert stats.running_cap < 4 and stats.num_running == 4 and stats.num_waiting == 28
    while engine.has_unfinished():  # capped, not stuck
        engine.step()

    relaxed = LLMEngine.from_checkpoint(
        dev_checkpoint, EngineConfig(num_kv_blocks=512, target_step_ms=10_000)
    )
    for i in range(32):
        relaxed.add_request(f"r{i}", rng.integers(0, 8192, 16).tolist(), params)
    relaxed.step()
    assert relaxed.stats().num_running == 32


def test_a_failing_step_fails_in_flight_requests_and_the_engine_keeps_serving(dev_checkpoint: Path) -> None:
    engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=64))
    real_step = engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real_step()

    engine.step = flaky_step  # type: ignore[method-assign]
    thread = EngineThread(engine)
    try:
        doomed = thread.submit(
            "doomed", [1, 2, 3], SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
        )
        last = drain(doomed)[-1]
        assert last.error is not None and "boom" in last.error
        assert last.error_kind is StreamError.ENGINE_ERROR
        assert engine.block_pool.num_used_blocks == 0
        fine = thread.submit("fine", [1, 2, 3], SamplingParams(max_tokens=3, temperature=0))
        assert drain(fine)[-1].finish_reason is FinishReason.LENGTH
    finally:
        thread.close()


def test_a_wave_of_prompts_does_not_cut_the_running_cap(dev_checkpoint: Path) -> None:
    """Prefill steps run the whole step budget and take far longer than the target; the cap is about the
    batch's size, judged on decode-only steps, so the wave is admitted whole rather than a few at a time."""
    cfg = EngineConfig(num_kv_blocks=512, target_step_ms=1.0, max_num_running=64)
    engine = LLMEngine.from_checkpoint(dev_checkpoint, cfg)
    rng = np.random.default_rng(1)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"wave{i}", rng.integers(0, 8192, 200).tolist(), params)
    for _ in range(3):  # 1,600 prompt tokens: three steps of prefill
        engine.step()
    stats = engine.stats()
    assert stats.running_cap == 64 and stats.num_running == 8 and stats.num_waiting == 0


def test_a_step_with_enough_prefill_runs_on_the_prefill_team(dev_checkpoint: Path) -> None:
    """The team is the stepping thread's own OpenMP setting: the prefill team for a step with at least
    parallel_prefill_min_tokens prompt tokens, the starting team for the others."""
    starting = elementwise_ext.get_max_threads()
    prefill_team = starting + 1
    cfg = EngineConfig(num_kv_blocks=256, prefill_num_threads=prefill_team, parallel_prefill_min_tokens=64)
    engine = LLMEngine.from_checkpoint(dev_checkpoint, cfg)
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    try:
        engine.add_request("long", list(range(3, 103)), params)
        engine.step()  # 100 prompt tokens
        assert elementwise_ext.get_max_threads() == prefill_team
        engine.step()  # a decode
        assert elementwise_ext.get_max_threads() == starting
        engine.add_request("short", list(range(3, 40)), params)
        engine.step()  # 37 prompt tokens and a decode: under the threshold
        assert elementwise_ext.get_max_threads() == starting
    finally:
        elementwise_ext.set_num_threads(starting)
    with pytest.raises(ValueError, match="prefill_num_threads must be in"):
        EngineConfig(prefill_num_threads=0)
    with pytest.raises(ValueError, match="parallel_prefill_min_tokens must be at least 1"):
        EngineConfig(parallel_prefill_min_tokens=0)


def test_the_prefill_num_threads_setting_reads_auto_empty_and_a_count() -> None:
    """One reading of the replica's setting, for the model (replica_converters) and the bench's engine
    on the replica's threads (bench.e2e_side_by_side) alike."""
    assert prefill_num_threads_of("auto") == len(os.sched_getaffinity(0))
    assert prefill_num_threads_of("3") == 3
    assert prefill_num_threads_of("") is None  # every step on the team the server started with
    with pytest.raises(ValueError):
        prefill_num_threads_of("many")
