"""Per-request sampling parameters and the sampler that turns logits into next tokens."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np


class PriorityClass(IntEnum):
    """Lower value = served first. Interactive work preempts batch work, never the reverse."""

    INTERACTIVE = 0
    BATCH = 1


@dataclass(frozen=True)
class SamplingParams:
    """What the caller asked for. temperature 0 means greedy; top_k 0 means no top-k cut."""

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
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sample_tokens(
    logits: np.ndarray, params: list[SamplingParams], generators: list[np.random.Generator | None]
) -> np.ndarray:
    """Pick one token per row of ``logits`` ([num_rows, vocab]) under that row's parameters.

    Greedy rows are one vectorised argmax; sampled rows use their own generator, so a request with a
    seed draws the same tokens whatever else shares its batch.
    """
    tokens = np.argmax(logits, axis=-1).astype(np.int64)
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if p.greedy:
            continue
        assert gen is not None, "sampled requests carry a generator"
        tokens[row] = _sample_row(logits[row], p, gen)
    return tokens


def _sample_row(row_logits: np.ndarray, p: SamplingParams, gen: np.random.Generator) -> int:
    scaled = row_logits.astype(np.float64) / p.temperature
    candidates = np.arange(scaled.shape[0])
    if 0 < p.top_k < scaled.shape[0]:
        candidates = np.argpartition(-scaled, p.top_k - 1)[: p.top_k]
        scaled = scaled[candidates]
    order = np.argsort(-scaled, kind="stable")
    candidates, scaled = candidates[order], scaled[order]
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    if p.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (always at least the best token).
        keep = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
    return int(candidates[int(gen.choice(probs.shape[0], p=probs))])
