from __future__ import annotations

import numpy as np
import pytest

from cpu_engine.sampling import MIN_SAMPLED_TEMPERATURE, SamplingParams, sample_tokens, top_p_keep

PROBS = np.array([0.5, 0.3, 0.15, 0.05])


def _draws(logits: np.ndarray, params: SamplingParams, num_draws: int, seed: int = 0) -> set[int]:
    gen = np.random.default_rng(seed)
    return {int(sample_tokens(logits, [params], [gen])[0]) for _ in range(num_draws)}


def test_greedy_is_argmax() -> None:
    logits = np.array([[0.1, 3.0, 2.0], [5.0, 1.0, 0.0]], dtype=np.float32)
    params = [SamplingParams(temperature=0)] * 2
    assert sample_tokens(logits, params, [None, None]).tolist() == [1, 0]


def test_top_k_one_is_greedy_and_top_p_keeps_the_mass() -> None:
    # NOTE: every top_p here is well inside a gap of the cumulative mass (0.5, 0.8, 0.95, 1.0), so no
    # draw depends on how the last bit of a sum rounds. The boundary itself is tested below.
    logits = np.log(PROBS)[None, :]
    assert _draws(logits, SamplingParams(top_k=1), 50) == {0}
    assert _draws(logits, SamplingParams(top_p=0.4), 50) == {0}
    assert _draws(logits, SamplingParams(top_p=0.7), 400) == {0, 1}  # 0.5 < 0.7 <= 0.8: the tail is cut
    assert _draws(logits, SamplingParams(top_p=0.9), 400) == {0, 1, 2}


@pytest.mark.parametrize("nudge", [-4e-15, -1e-16, 0.0, 1e-16, 4e-15])
def test_a_top_p_cut_at_an_exact_boundary_keeps_the_prefix_that_reaches_it(nudge: float) -> None:
    """0.5 + 0.3 against top_p 0.8: the sum lands a few ulps either side of 0.8 depending on the CPU's
    exp(); within the tolerance it counts as reaching top_p, so token 2 is never drawn."""
    probs = np.array([0.5, 0.3 + nudge, 0.15, 0.05 - nudge])
    assert top_p_keep(probs, 0.8) == 2
    assert _draws(np.log(probs)[None, :], SamplingParams(top_p=0.8), 400) == {0, 1}


def test_top_p_keep_bounds() -> None:
    assert top_p_keep(PROBS, 1.0) == 4
    assert top_p_keep(PROBS, 1e-300) == 1  # always the best token
    assert top_p_keep(PROBS, 0.999999) == 4
    assert top_p_keep(np.array([0.6, 0.3999]), 0.99999999) == 2  # mass short of 1 by rounding: no overflow


@pytest.mark.parametrize("temperature", [1e-310, 1e-30, MIN_SAMPLED_TEMPERATURE / 2])
def test_a_tiny_positive_temperature_is_greedy(temperature: float) -> None:
    params = SamplingParams(temperature=temperature)
    assert params.greedy
    logits = np.array([[0.0, 1000.0, -1000.0, 999.9]], dtype=np.float32)
    assert sample_tokens(logits, [params], [None]).tolist() == [1]


def test_the_smallest_sampled_temperature_neither_overflows_nor_warns() -> None:
    logits = np.array([[0.0, 1000.0, -1000.0, 999.0]], dtype=np.float32)
    with np.errstate(all="raise"):
        assert _draws(logits, SamplingParams(temperature=MIN_SAMPLED_TEMPERATURE), 20) == {1}


def test_a_row_that_cannot_be_sampled_does_not_fail_the_others() -> None:
    logits = np.array(
        [[0.0, np.nan, 3.0, 1.0], [0.0, 5.0, 1.0, 1.0], [np.inf, 0.0, 1.0, 2.0], [0.0, 1.0, 9.0, 1.0]]
    )
    sampled, greedy = SamplingParams(temperature=1.0), SamplingParams(temperature=0)
    params = [sampled, SamplingParams(top_k=1), sampled, greedy]
    gens = [np.random.default_rng(i) for i in range(3)] + [None]
    # The bad rows fall back to their argmax (NaN never wins); the good ones are sampled as usual.
    assert sample_tokens(logits, params, gens).tolist() == [2, 1, 0, 2]


def test_same_seed_same_draws() -> None:
    logits = np.random.default_rng(1).standard_normal((1, 100)).astype(np.float32)
    p = SamplingParams(temperature=1.0, seed=7)
    a = [sample_tokens(logits, [p], [g])[0] for g in [np.random.default_rng(7)] for _ in range(20)]
    b = [sample_tokens(logits, [p], [g])[0] for g in [np.random.default_rng(7)] for _ in range(20)]
    assert a == b


@pytest.mark.parametrize(
    "kwargs",
    [{"max_tokens": 0}, {"temperature": -1}, {"temperature": float("nan")}, {"top_p": 0}, {"top_p": 1.5},
     {"top_k": -1}],
)  # fmt: skip
def test_invalid_params_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)
