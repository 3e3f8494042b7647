"""n answers to one prompt, and log-probabilities, in the CPU engine (issue 25).

n > 1: the prompt is prefilled once (the siblings fork from its computed blocks, copy-on-write on the
partial last block); each answer draws from its own stream (the first from the seed's own, so answer 0 is
what n = 1 gives); aborting the request ends every answer and frees every block.

Log-probabilities: the model's log-softmax before any sampling adjustment, within 1e-2 of transformers'
float32 on the dev checkpoint, and the alternatives are the most likely tokens, most likely first."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cpu_engine.config import EngineConfig
from cpu_engine.engine import LLMEngine, RequestOutput
from cpu_engine.runner import StepSamples
from cpu_engine.sampling import SamplingParams
from cpu_engine.step_plan import SchedulerOutput
from sluice.wire import FinishReason

PROMPT = list(range(40, 40 + 37))  # 37 tokens: two full blocks of 16 and a partial one


@pytest.fixture
def engine(dev_checkpoint: Path) -> LLMEngine:
    return LLMEngine.from_checkpoint(
        dev_checkpoint, EngineConfig(num_kv_blocks=256, block_size_tokens=16, dtype="float32")
    )


def run(
    engine: LLMEngine, params: SamplingParams, prompt: list[int] = PROMPT
) -> dict[int, list[RequestOutput]]:
    engine.add_request("r", prompt, params, cache_scope="t")
    outputs: dict[int, list[RequestOutput]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            outputs.setdefault(out.index, []).append(out)
    return outputs


def tokens(outputs: list[RequestOutput]) -> list[int]:
    return [t for out in outputs for t in out.new_token_ids]


def count_prefill_tokens(engine: LLMEngine) -> list[int]:
    """Wrap the runner so that every step adds the prompt tokens it computes to the returned list."""
    counted: list[int] = []
    execute = engine.runner.execute

    def counting(out: SchedulerOutput) -> StepSamples:
        counted.append(out.num_prefill_tokens)
        return execute(out)

    engine.runner.execute = counting  # type: ignore[method-assign]
    return counted


def test_n_answers_share_one_prefill(engine: LLMEngine) -> None:
    prefill = count_prefill_tokens(engine)
    outputs = run(engine, SamplingParams(max_tokens=12, temperature=1.0, seed=7, n=4, ignore_eos=True))
    assert sorted(outputs) == [0, 1, 2, 3]
    assert sum(prefill) == len(PROMPT)  # once, not four times
    answers = [tokens(outputs[i]) for i in range(4)]
    assert all(len(a) == 12 for a in answers)
    assert len({tuple(a) for a in answers}) > 1  # each its own draws
    for i in range(4):
        assert outputs[i][-1].finished and outputs[i][-1].finish_reason is FinishReason.LENGTH
    finals = [out for outs in outputs.values() for out in outs if out.request_finished]
    assert len(finals) == 1  # the request's end is said once, on its last output
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks  # every block back


def test_the_first_answer_is_what_n_1_gives_and_seeds_reproduce(engine: LLMEngine) -> None:
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3, ignore_eos=True)
    alone = tokens(run(engine, params)[0])
    many = run(engine, SamplingParams(max_tokens=10, temperature=1.0, seed=3, n=3, ignore_eos=True))
    again = run(engine, SamplingParams(max_tokens=10, temperature=1.0, seed=3, n=3, ignore_eos=True))
    assert tokens(many[0]) == alone
    assert [tokens(many[i]) for i in range(3)] == [tokens(again[i]) for i in range(3)]


def test_greedy_answers_are_identical(engine: LLMEngine) -> None:
    outputs = run(engine, SamplingParams(max_tokens=8, temperature=0.0, n=3, ignore_eos=True))
    assert tokens(outputs[0]) == tokens(outputs[1]) == tokens(outputs[2])


def test_aborting_ends_every_answer(engine: LLMEngine) -> None:
    engine.add_request(
        "r", PROMPT, SamplingParams(max_tokens=50, temperature=1.0, n=3, ignore_eos=True), cache_scope="t"
    )
    for _ in range(3):
        engine.step()
    ended = engine.abort_request("r")
    assert sorted(out.index for out in ended) == [0, 1, 2]
    assert all(out.finish_reason is FinishReason.ABORT for out in ended)
    assert [out.request_finished for out in ended] == [False, False, True]
    assert not engine.has_unfinished()
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_blocks


def test_aborting_before_the_prompt_is_computed_ends_the_waiting_siblings(engine: LLMEngine) -> None:
    engine.add_request("r", PROMPT, SamplingParams(max_tokens=5, n=3), cache_scope="t")
    ended = engine.abort_request("r")
    assert sorted(out.index for out in ended) == [0, 1, 2]
    assert not engine.has_unfinished()


def test_no_logprobs_unless_asked(engine: LLMEngine) -> None:
    outputs = run(engine, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert all(out.new_logprobs is None for out in outputs[0])


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def test_logprobs_match_transformers(engine: LLMEngine, dev_checkpoint: Path) -> None:
    """Sampled with a penalty and a temperature (adjustments that must not show in the values)."""
    params = SamplingParams(
        max_tokens=8, temperature=0.7, seed=5, logprobs=5, ignore_eos=True, presence_penalty=1.5
    )
    outputs = run(engine, params)[0]
    made = tokens(outputs)
    reported = [lp for out in outputs for lp in out.new_logprobs or []]
    assert len(reported) == len(made) == 8
    model = transformers.LlamaForCausalLM.from_pretrained(dev_checkpoint, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT + made])).logits[0, len(PROMPT) - 1 : -1]
    expected = torch.log_softmax(logits.double(), dim=-1).numpy()
    for step, (token, lp) in enumerate(zip(made, reported, strict=True)):
        assert lp.logprob == pytest.approx(expected[step, token], abs=1e-2)
        assert len(lp.top) == 5
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        for alt, value in lp.top:
            assert value == pytest.approx(expected[step, alt], abs=1e-2)
        ranked = np.sort(expected[step])[::-1]
        if ranked[4] - ranked[5] > 1e-2:  # no near-tie at the cut: the same five tokens
            assert {t for t, _ in lp.top} == set(np.argsort(-expected[step])[:5].tolist())


def test_prompt_logprobs_match_transformers_and_skip_the_prefix_cache(dev_checkpoint: Path) -> None:
    """Each prompt token's log-probability after the ones before it (echo with logprobs), computed whole
    even when the prompt's blocks are cached, and across chunks of a long prompt."""
    config = EngineConfig(num_kv_blocks=256, block_size_tokens=16, dtype="float32", step_token_budget=64)
    engine = LLMEngine.from_checkpoint(dev_checkpoint, config)
    prompt = list(range(100, 100 + 150))  # three prefill chunks of at most 64
    run(engine, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True), prompt)  # caches its blocks
    outputs = run(
        engine,
        SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=True),
        prompt,
    )[0]
    first = outputs[0]
    assert first.num_cached_prompt_tokens == 0  # not served from the cache
    assert first.prompt_logprobs is not None and len(first.prompt_logprobs) == len(prompt) - 1
    assert all(out.prompt_logprobs is None for out in outputs[1:])
    model = transformers.LlamaForCausalLM.from_pretrained(dev_checkpoint, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0, :-1]
    expected = torch.log_softmax(logits.double(), dim=-1).numpy()
    for position, lp in enumerate(first.prompt_logprobs):
        assert lp.logprob == pytest.approx(expected[position, prompt[position + 1]], abs=1e-2)
        assert len(lp.top) == 2 and lp.top[0][1] >= lp.top[1][1]
