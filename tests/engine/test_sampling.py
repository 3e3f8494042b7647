from __future__ import annotations

import numpy as np
import pytest

from cpu_engine.sampling import SamplingParams, sample_tokens


def test_greedy_is_argmax() -> None:
    logits = np.array([[0.1, 3.0, 2.0], [5.0, 1.0, 0.0]], dtype=np.float32)
    params = [SamplingParams(temperature=0)] * 2
    assert sample_tokens(logits, params, [None, None]).tolist() == [1, 0]


def test_top_k_one_is_greedy_and_top_p_keeps_the_mass() -> None:
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], dtype=np.float64))
    gen = np.random.default_rng(0)
    draws = [sample_tokens(logits, [SamplingParams(top_k=1)], [gen])[0] for _ in range(50)]
    assert set(draws) == {0}
    draws = [sample_tokens(logits, [SamplingParams(top_p=0.8)], [gen])[0] for _ in range(400)]
    assert set(draws) == {0, 1}  # 0.5 + 0.3 reaches 0.8; the tail is cut


def test_same_seed_same_draws() -> None:
    logits = np.random.default_rng(1).standard_normal((1, 100)).astype(np.float32)
    p = SamplingParams(temperature=1.0, seed=7)
    a = [sample_tokens(logits, [p], [g])[0] for g in [np.random.default_rng(7)] for _ in range(20)]
    b = [sample_tokens(logits, [p], [g])[0] for g in [np.random.default_rng(7)] for _ in range(20)]
    assert a == b


@pytest.mark.parametrize(
    "kwargs", [{"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"top_k": -1}]
)
def test_invalid_params_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
