"""Per-request sampling parameters and the sampler that turns logits into next tokens."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

# Below this a temperature samples as greedy (vLLM's threshold): dividing logits by 1e-310 overflows to
# inf (and inf - inf is NaN), and anything this small puts all the mass on the argmax anyway.
MIN_SAMPLED_TEMPERATURE = 1e-5
# The top-p cut keeps the smallest prefix whose mass reaches top_p; a prefix short of it by less than
# this counts as reaching it, so a cut exactly at a boundary (0.5 + 0.3 for top_p 0.8) does not depend
# on the last bit of a SIMD exp() (which differs between CPUs with and without AVX-512).
TOP_P_TOLERANCE = 1e-9


@dataclass(frozen=True)
class SamplingParams:
    """What the caller asked for. temperature 0 (or below ``MIN_SAMPLED_TEMPERATURE``) means greedy;
    top_k 0 means no top-k cut."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not self.temperature >= 0:  # NOTE: also refuses NaN
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_SAMPLED_TEMPERATURE


def sample_tokens(
    logits: np.ndarray, params: list[SamplingParams], generators: list[np.random.Generator | None]
) -> np.ndarray:
    """Pick one token per row of ``logits`` ([num_rows, vocab]) under that row's parameters.

    Greedy rows are one vectorised argmax; sampled rows use their own generator, so a request with a
    seed draws the same tokens whatever else shares its batch. A row that cannot be sampled (logits
    that are not finite) takes its argmax instead and is logged: one request's bad row never fails the
    other sequences of the step.
    """
    tokens = np.argmax(logits, axis=-1).astype(np.int64)
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if p.greedy:
            continue
        assert gen is not None, "sampled requests carry a generator"
        try:
            tokens[row] = _sample_row(logits[row], p, gen)
        except (ValueError, FloatingPointError) as exc:
            log.warning("sampling row %d failed (%s); taking its argmax", row, exc)
            tokens[row] = int(np.argmax(np.where(np.isnan(logits[row]), -np.inf, logits[row])))
    return tokens


def top_p_keep(sorted_probs: np.ndarray, top_p: float) -> int:
    """How many of the probabilities (sorted, largest first, summing to 1) the top-p cut keeps: the
    smallest prefix whose mass reaches ``top_p`` within ``TOP_P_TOLERANCE``, at least one."""
    if top_p >= 1.0:
        return int(sorted_probs.shape[0])
    reached = int(np.searchsorted(np.cumsum(sorted_probs), top_p - TOP_P_TOLERANCE))
    return max(1, min(reached + 1, int(sorted_probs.shape[0])))


def _sample_row(row_logits: np.ndarray, p: SamplingParams, gen: np.random.Generator) -> int:
    logits = row_logits.astype(np.float64)
    if not np.isfinite(logits).all():
        raise ValueError("the logits are not all finite")
    # NOTE: shifted to a maximum of 0 before dividing, so every scaled logit is <= 0 and finite for any
    # temperature >= MIN_SAMPLED_TEMPERATURE (no overflow, no inf - inf).
    scaled = (logits - logits.max()) / p.temperature
    candidates = np.arange(scaled.shape[0])
    if 0 < p.top_k < scaled.shape[0]:
        candidates = np.argpartition(-scaled, p.top_k - 1)[: p.top_k]
        scaled = scaled[candidates]
    order = np.argsort(-scaled, kind="stable")
    candidates, scaled = candidates[order], scaled[order]
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    keep = top_p_keep(probs, p.top_p)
    if keep < probs.shape[0]:
        candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
    return int(candidates[int(gen.choice(probs.shape[0], p=probs))])
