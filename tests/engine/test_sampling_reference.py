"""The sampler's controls against their reference implementations: transformers' logits processors for
the repetition penalty, temperature, top-k, top-p and min-p (transformers/generation/logits_process.py:
``RepetitionPenaltyLogitsProcessor``, ``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``, ``MinPLogitsWarper``), and OpenAI's definition of the presence and frequency
penalties and of logit_bias (written out here row by row, as vLLM applies them), on random logits (no
ties) for a whole batch of rows with different controls at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from cpu_engine.sampling import SamplingParams, apply_penalties, sample_tokens, sampling_distribution

VOCAB = 64


def _reference_logits(
    logits: np.ndarray, p: SamplingParams, tokens: list[int], num_prompt: int
) -> np.ndarray:
    biased = logits.copy()
    for token, bias in p.logit_bias:  # first, as vLLM applies it
        biased[token] += bias
    row = torch.tensor(biased[None, :], dtype=torch.float32)
    if p.repetition_penalty != 1.0:
        row = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(torch.tensor([tokens]), row)
    out = row[0].numpy().astype(np.float32)
    for token in set(tokens[num_prompt:]):  # OpenAI: output tokens only
        out[token] -= p.frequency_penalty * tokens[num_prompt:].count(token) + p.presence_penalty
    return out


def _reference_probs(logits: np.ndarray, p: SamplingParams) -> np.ndarray:
    warpers = LogitsProcessorList([TemperatureLogitsWarper(p.temperature)])
    if p.top_k:
        warpers.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        warpers.append(TopPLogitsWarper(p.top_p))
    if p.min_p:
        warpers.append(MinPLogitsWarper(p.min_p))
    scores = warpers(torch.zeros(1, 1, dtype=torch.long), torch.tensor(logits[None, :], dtype=torch.float64))
    return torch.softmax(scores, dim=-1)[0].numpy()


ROWS = [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.3, top_k=7),
    SamplingParams(temperature=0.7, top_p=0.6),
    SamplingParams(temperature=1.0, min_p=0.2),
    SamplingParams(temperature=0.9, top_k=20, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.1, repetition_penalty=1.3),
    SamplingParams(temperature=1.0, presence_penalty=0.8, frequency_penalty=0.5),
    SamplingParams(temperature=1.0, presence_penalty=-1.0, frequency_penalty=-0.3, repetition_penalty=0.7),
    SamplingParams(temperature=0.6, logit_bias=((3, 5.0), (9, -100.0), (40, 1.5))),
    SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=1.0),  # greedy, penalised
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_batch_of_controls_matches_the_references_row_by_row(seed: int) -> None:
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((len(ROWS), VOCAB)) * 3).astype(np.float32)
    histories = [([int(t) for t in rng.integers(0, VOCAB, 30)], 12) for _ in ROWS]
    processed = logits.copy()
    apply_penalties(processed, ROWS, histories, list(range(len(ROWS))))
    for r, (p, (tokens, num_prompt)) in enumerate(zip(ROWS, histories, strict=True)):
        reference = _reference_logits(logits[r], p, tokens, num_prompt)
        np.testing.assert_allclose(processed[r], reference, rtol=1e-6, atol=1e-5)  # float32 sums' order
    sampled = [r for r, p in enumerate(ROWS) if not p.greedy]
    probs, order = sampling_distribution(processed[sampled], [ROWS[r] for r in sampled])
    for i, r in enumerate(sampled):
        ours = np.zeros(VOCAB)
        ours[order[i]] = probs[i]
        np.testing.assert_allclose(ours, _reference_probs(processed[r], ROWS[r]), atol=1e-9)
    greedy = [r for r, p in enumerate(ROWS) if p.greedy]
    gens = [None if p.greedy else np.random.default_rng(r) for r, p in enumerate(ROWS)]
    tokens = sample_tokens(logits, ROWS, gens, histories)
    for r in greedy:  # the penalties apply before greedy's argmax too
        assert tokens[r] == int(np.argmax(_reference_logits(logits[r], ROWS[r], *histories[r])))
    for r in sampled:  # every draw is a token the distribution can produce
        assert _reference_probs(processed[r], ROWS[r])[tokens[r]] > 0


def test_draws_follow_the_distribution_and_a_seed_repeats_them() -> None:
    p = SamplingParams(temperature=1.0, top_k=5, presence_penalty=0.5)
    logits = np.random.default_rng(5).standard_normal((1, VOCAB)).astype(np.float32)
    history = [([1, 2, 3, 4], 2)]
    processed = logits.copy()
    apply_penalties(processed, [p], history, [0])
    expected = _reference_probs(processed[0], p)
    gen = np.random.default_rng(11)
    draws = np.array([sample_tokens(logits, [p], [gen], history)[0] for _ in range(4000)])
    freq = np.bincount(draws, minlength=VOCAB) / draws.size
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(expected))
    np.testing.assert_allclose(freq, expected, atol=0.03)  # 4,000 draws: a few standard errors
    again = np.random.default_rng(11)
    assert [sample_tokens(logits, [p], [again], history)[0] for _ in range(50)] == draws[:50].tolist()


@pytest.mark.parametrize(
    "kwargs",
    [{"min_p": 1.5}, {"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0},
     {"logit_bias": ((1, 101.0),)}, {"logit_bias": ((-1, 1.0),)}],
)  # fmt: skip
def test_out_of_range_controls_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)  # type: ignore[arg-type]
