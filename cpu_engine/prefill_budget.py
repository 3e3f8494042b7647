"""How many prefill tokens one step may carry, so prompts do not stall the streams already decoding.

A step's time grows with its prefill chunks: on a 2-core Xeon, 32 decodes take about 4 ms and 32 decodes
plus a 128-token chunk about 12 ms, so every stream's next token waits 3x as long. ``prefill_token_budget``
is the decision: the whole budget left after decodes when nothing decodes (time to first token is all
that matters then), otherwise as many tokens as keep the step within about ``stretch`` times a
decode-only step, never fewer than a floor (prompts always progress) nor more than the budget left. It
is pure: the costs come in. ``StepCostModel`` learns them from measured steps.

NOTE: three things widen the share, all for arrivals. (1) A step may always fill up to ``fill_to_ms``
(the scheduler passes the engine's step-time target, itself half the inter-token target): every stream's
gap is within its target at that length anyway, where a ratio of a short decode step is not (the
engine's running cap is judged on decode-only steps, so such steps do not cut it).
Measured through the stack on a 2-core AMD EPYC (8 prompts of 1,000 tokens arriving together, 64-token
answers): the last first token came 700-780 ms after the wave with the ratio alone, 440-460 ms without
any bound. (2) The decode step it is measured against is that of the batch to come, the decoding
sequences plus the prompts in line: they all decode once their prompts are in, so that step is the
inter-token latency every stream gets anyway. (3) When more streams wait for their first token than for
their next one, the extra time grows in proportion (w / d): after a wave with 4 sequences decoding and 28
waiting, holding each step to twice a 4-decode step (16-token chunks on that Xeon) would multiply 28
times to first token to protect 4 inter-token gaps. Measured on that Xeon at 32 streams through
tritonserver, without (3) TTFT p95 rose from 190 to 330 ms, with it to about 230 ms, for the same
inter-token p95.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepCosts:
    """A step's time as a line: ``fixed_ms + per_decode_token_ms * d + per_prefill_token_ms * p``."""

    fixed_ms: float
    per_decode_token_ms: float
    per_prefill_token_ms: float

    def step_ms(self, num_decode_tokens: int, num_prefill_tokens: int) -> float:
        return (
            self.fixed_ms
            + self.per_decode_token_ms * num_decode_tokens
            + self.per_prefill_token_ms * num_prefill_tokens
        )


def prefill_token_budget(
    *,
    num_decode_tokens: int,
    num_prompt_sequences: int,
    num_tokens_left: int,
    stretch: float | None,
    min_prefill_tokens: int,
    costs: StepCosts | None,
    fill_to_ms: float | None = None,
) -> int:
    """Prefill tokens this step may carry, given its ``num_decode_tokens`` (``d``, one per decoding
    sequence), the ``num_prompt_sequences`` (``w``) in prefill or waiting to start it, and the
    ``num_tokens_left`` of the step budget after the decodes.

    ``stretch`` None, nothing decoding, or no usable costs yet (None, or a prefill token that costs
    nothing): ``num_tokens_left``. Otherwise prefill may add ``(stretch * D(d + w) - D(d)) * max(1, w / d)``
    milliseconds to the decode-only step ``D(d) = costs.step_ms(d, 0)``, or fill the step up to
    ``fill_to_ms`` if that is more, rounded down to whole tokens, at least ``min_prefill_tokens`` and at
    most ``num_tokens_left``."""
    if stretch is None or num_decode_tokens == 0 or costs is None or costs.per_prefill_token_ms <= 0:
        return num_tokens_left
    decode_ms = costs.step_ms(num_decode_tokens, 0)
    batch_decode_ms = costs.step_ms(num_decode_tokens + num_prompt_sequences, 0)
    extra_ms = (stretch * batch_decode_ms - decode_ms) * max(1.0, num_prompt_sequences / num_decode_tokens)
    if fill_to_ms is not None:
        extra_ms = max(extra_ms, fill_to_ms - decode_ms)
    allowed = extra_ms / costs.per_prefill_token_ms
    # NOTE: a fit that predicts a negative decode step gives a negative allowance: the floor then holds.
    num_allowed = math.floor(allowed + 1e-9) if allowed > 0 else 0
    return min(num_tokens_left, max(min_prefill_tokens, num_allowed))


class StepCostModel:
    """Fits ``StepCosts`` to measured steps by least squares, each older step weighing ``decay`` times
    less (0.99: a half-life of about 70 steps, so the fit follows context growth and load changes).

    ``costs()`` is None until ``min_num_steps`` steps were observed. When the steps seen cannot tell a
    decode token from a prefill token (every step full, so ``d + p`` is constant), a weak prior that
    both cost the same settles the split; any data that tells them apart outweighs it.
    """

    # Weight of the prior "a decode token costs what a prefill token costs", in squared tokens: next to
    # the data (hundreds of steps x tens of tokens, squared) it only matters where the data is silent.
    _TIE_WEIGHT = 1.0
    _RIDGE = 1e-6  # keeps the system solvable before the steps vary at all

    def __init__(self, decay: float = 0.99, min_num_steps: int = 8) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError("decay must be in (0, 1]")
        self.decay = decay
        self.min_num_steps = min_num_steps
        self.num_steps = 0
        self._gram = np.zeros((3, 3))
        self._moment = np.zeros(3)
        tie = np.array([0.0, 1.0, -1.0])
        self._prior = self._TIE_WEIGHT * np.outer(tie, tie) + self._RIDGE * np.eye(3)
        self._costs: StepCosts | None = None

    def observe(self, num_decode_tokens: int, num_prefill_tokens: int, step_ms: float) -> None:
        """Add one measured step: its composition and how long it took."""
        x = np.array([1.0, float(num_decode_tokens), float(num_prefill_tokens)])
        self._gram = self.decay * self._gram + np.outer(x, x)
        self._moment = self.decay * self._moment + step_ms * x
        self.num_steps += 1
        self._costs = None  # refitted on the next costs()

    def costs(self) -> StepCosts | None:
        """The current fit, or None before ``min_num_steps`` steps."""
        if self.num_steps < self.min_num_steps:
            return None
        if self._costs is None:
            fixed, per_decode, per_prefill = np.linalg.solve(self._gram + self._prior, self._moment)
            self._costs = StepCosts(float(fixed), float(per_decode), float(per_prefill))
        return self._costs
