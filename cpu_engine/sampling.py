"""Per-request sampling parameters and the sampler that turns logits into next tokens."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from sluice.wire import Guide

log = logging.getLogger(__name__)

# Below this a temperature samples as greedy (vLLM's threshold): dividing logits by 1e-310 overflows to
# inf (and inf - inf is NaN), and anything this small puts all the mass on the argmax anyway.
MIN_SAMPLED_TEMPERATURE = 1e-5
# The top-p cut keeps the smallest prefix whose mass reaches top_p; a prefix short of it by less than
# this counts as reaching it, so a cut exactly at a boundary (0.5 + 0.3 for top_p 0.8) does not depend
# on the last bit of a SIMD exp() (which differs between CPUs with and without AVX-512).
TOP_P_TOLERANCE = 1e-9
_MAX_LOG_RATIO = 700.0  # exp(-700) is still a normal float64
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's top_logprobs limit)
MAX_N = 128  # answers per request (the gateway's own limit, SLUICE_MAX_N, is lower)


@dataclass(frozen=True)
class SamplingParams:
    """What the caller asked for. temperature 0 (or below ``MIN_SAMPLED_TEMPERATURE``) means greedy;
    top_k 0 means no top-k cut, min_p 0 no min-p cut. Penalties as OpenAI and vLLM define them:
    ``presence_penalty`` and ``frequency_penalty`` subtract from the logit of every token the output
    already holds (once, and once per occurrence); ``repetition_penalty`` divides a positive logit (and
    multiplies a negative one) of every token the prompt or the output holds; ``logit_bias`` adds to
    the logits of the token ids it names. All apply before greedy's argmax too."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    guide: Guide | None = None  # structured output: the answer matches it (cpu_engine.grammar)
    # Report each token's log-probability (the model's log-softmax, before any of the above) and this many
    # most likely alternatives; None: none.
    logprobs: int | None = None
    # Also each prompt token's log-probability after the tokens before it (with ``logprobs``
    # alternatives): the prompt is then computed whole, never served from the prefix cache.
    prompt_logprobs: bool = False
    n: int = 1  # answers to the prompt, prefilled once (cpu_engine.scheduler forks them)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not self.temperature >= 0:  # NOTE: also refuses NaN
            raise ValueError("temperature must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError("min_p must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError("repetition_penalty must be in (0, 2]")
        if any(not -100.0 <= bias <= 100.0 or token < 0 for token, bias in self.logit_bias):
            raise ValueError("logit_bias values must be in [-100, 100] for token ids >= 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")
        if self.prompt_logprobs and self.logprobs is None:
            raise ValueError("prompt_logprobs needs logprobs (the number of alternatives)")
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}]")
        if self.guide is not None and self.ignore_eos:
            raise ValueError(
                "ignore_eos cannot be combined with a guide (the answer ends where it is complete)"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_SAMPLED_TEMPERATURE

    @property
    def penalised(self) -> bool:
        """Whether the logits change before the choice (bias or penalties)."""
        return bool(
            self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
        )


def sample_tokens(
    logits: np.ndarray,
    params: list[SamplingParams],
    generators: list[np.random.Generator | None],
    histories: list[tuple[list[int], int]] | None = None,
) -> np.ndarray:
    """Pick one token per row of ``logits`` ([num_rows, vocab]) under that row's parameters;
    ``histories`` (each row's token ids and how many of them are the prompt) feed the penalties and may
    be left out when no row has any.

    Vectorised across the rows: the bias and penalties, then greedy's argmax or, for sampled rows,
    temperature, top-k, top-p and min-p (transformers' order) and one draw each. A sampled row draws from
    its own generator, so a request with a seed draws the same tokens whatever else shares its batch. A
    row that cannot be sampled (logits that are not finite) takes its argmax instead and is logged: one
    request's bad row never fails the other sequences of the step. A logit of -inf is a token the row may
    not take (structured output's mask): never picked while any other is allowed.
    """
    rows = np.arange(len(params))
    penalised = [r for r in rows if params[r].penalised]
    if penalised:
        if histories is None:
            raise ValueError("penalties need the rows' token histories")
        logits = logits.astype(np.float32, copy=True)
        apply_penalties(logits, [params[r] for r in penalised], [histories[r] for r in penalised], penalised)
    tokens = np.argmax(logits, axis=-1).astype(np.int64)
    sampled = [r for r in rows if not params[r].greedy]
    if not sampled:
        return tokens
    rows_sampled = logits[sampled]
    finite = ~(np.isnan(rows_sampled) | np.isposinf(rows_sampled)).any(axis=1) & np.isfinite(
        rows_sampled.max(axis=1)
    )
    for r in np.asarray(sampled)[~finite]:
        log.warning("sampling row %d failed (its logits are not all finite); taking its argmax", r)
        tokens[r] = int(np.argmax(np.where(np.isnan(logits[r]), -np.inf, logits[r])))
    good = [r for r, ok in zip(sampled, finite, strict=True) if ok]
    if good:
        chosen = [params[r] for r in good]
        probs, order = sampling_distribution(logits[good], chosen)
        draws = np.array([gen.random() for gen in (generators[r] for r in good) if gen is not None])
        if draws.shape[0] != len(good):
            raise ValueError("sampled requests carry a generator")
        # Inverse CDF: the first kept token whose cumulative mass passes the draw.
        picked = (np.cumsum(probs, axis=1) <= draws[:, None] * probs.sum(axis=1, keepdims=True)).sum(axis=1)
        last_kept = probs.shape[1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=1)  # rounding at the very end
        picked = np.minimum(picked, last_kept)
        tokens[good] = order[np.arange(len(good)), picked]
    return tokens


def token_logprobs(
    logits: np.ndarray, tokens: np.ndarray, num_top: list[int]
) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
    """Each row's log-probability of its chosen token and its ``num_top[row]`` most likely tokens with
    theirs (most likely first; of equal values, the lower token id first): the log-softmax of ``logits``
    [rows, vocab]. In float32 (a log-sum-exp over the vocabulary is good to ~1e-6 there) and the top
    tokens by repeated argmax (k passes over the rows at once: for OpenAI's k <= 20 far cheaper than a
    partition of every row)."""
    x = np.asarray(logits, dtype=np.float32)
    peak = x.max(axis=1, keepdims=True)
    log_z = peak[:, 0] + np.log(np.exp(x - peak).sum(axis=1))
    rows = np.arange(x.shape[0])
    chosen = x[rows, tokens] - log_z
    k = max(num_top, default=0)
    top_ids = np.empty((x.shape[0], k), dtype=np.int64)
    if k:
        left = x.copy()
        for j in range(k):
            top_ids[:, j] = np.argmax(left, axis=1)
            left[rows, top_ids[:, j]] = -np.inf
    top_values = np.take_along_axis(x, top_ids, axis=1) - log_z[:, None]
    return [
        (float(chosen[r]), tuple(zip(top_ids[r, :want].tolist(), top_values[r, :want].tolist(), strict=True)))
        for r, want in enumerate(num_top)
    ]


def apply_penalties(
    logits: np.ndarray,
    params: list[SamplingParams],
    histories: list[tuple[list[int], int]],
    rows: list[int],
) -> None:
    """The bias, then the penalties of ``params`` (vLLM's order: repetition, then frequency and
    presence), applied in place to ``logits[rows]``: for all the rows at once, over the (row, token)
    pairs their histories hold (never a [rows, vocab] count table)."""
    vocab = logits.shape[1]
    row_ids = np.asarray(rows, dtype=np.int64)
    for row, p in zip(rows, params, strict=True):  # first, as vLLM: the penalties see the biased logits
        if p.logit_bias:
            ids, biases = zip(*p.logit_bias, strict=True)
            logits[row, list(ids)] += np.asarray(biases, dtype=np.float32)
    repetition = np.array([p.repetition_penalty for p in params], dtype=np.float32)
    if (repetition != 1.0).any():  # prompt and output tokens, each once (transformers', vLLM's)
        seen = _unique_pairs([np.asarray(tokens, np.int64) for tokens, _ in histories], row_ids, vocab)
        r, t, _ = seen
        penalty = repetition[np.searchsorted(row_ids, r)]
        values = logits[r, t]
        logits[r, t] = np.where(values > 0, values / penalty, values * penalty)
    frequency = np.array([p.frequency_penalty for p in params], dtype=np.float32)
    presence = np.array([p.presence_penalty for p in params], dtype=np.float32)
    if frequency.any() or presence.any():  # output tokens only (OpenAI's definition)
        r, t, counts = _unique_pairs(
            [np.asarray(tokens[num_prompt:], np.int64) for tokens, num_prompt in histories], row_ids, vocab
        )
        at = np.searchsorted(row_ids, r)
        logits[r, t] -= frequency[at] * counts + presence[at]


def _unique_pairs(
    tokens: list[np.ndarray], rows: np.ndarray, vocab: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (row, token) pairs in ``tokens`` (one array per row of ``rows``, sorted) and how
    often each occurs."""
    keys = np.concatenate(
        [row * vocab + t for row, t in zip(rows, tokens, strict=True)] or [np.empty(0, np.int64)]
    )
    unique, counts = np.unique(keys, return_counts=True)
    return unique // vocab, unique % vocab, counts.astype(np.float32)


def sampling_distribution(logits: np.ndarray, params: list[SamplingParams]) -> tuple[np.ndarray, np.ndarray]:
    """For sampled rows: the probabilities a draw picks from, sorted from the most likely token down
    (zero where a cut removed the token), and the token id at each sorted place. Temperature, then top-k,
    top-p (the smallest prefix whose mass reaches it, within ``TOP_P_TOLERANCE``) and min-p (tokens at
    least ``min_p`` times as likely as the best), each keeping at least the best token."""
    x = logits.astype(np.float64)
    temperature = np.array([p.temperature for p in params])[:, None]
    # NOTE: shifted to a maximum of 0 before dividing, so every scaled logit is <= 0 and finite for any
    # temperature >= MIN_SAMPLED_TEMPERATURE (no overflow, no inf - inf).
    x = (x - x.max(axis=1, keepdims=True)) / temperature
    if any(p.top_k or p.top_p < 1.0 or p.min_p for p in params):
        # NOTE: float32 keys sort about twice as fast; the order they give is the logits' own but for
        # values within float32's rounding of each other, which no cut depends on.
        order = np.argsort(-x.astype(np.float32), axis=1)
        x = np.take_along_axis(x, order, axis=1)
    else:  # no cut: the draw needs no order (the common case, temperature alone)
        order = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    rank = np.arange(x.shape[1])[None, :]
    top_k = np.array([p.top_k if p.top_k > 0 else x.shape[1] for p in params])[:, None]
    # NOTE: a token e^700 times less likely than the best has probability 0 here, rather than a value
    # exp() would underflow to (which numpy reports as an error under np.errstate(all="raise")).
    below_best = np.maximum(x, -_MAX_LOG_RATIO)  # x's maximum is 0 (shifted above)
    probs = np.where((rank < top_k) & (below_best > -_MAX_LOG_RATIO), np.exp(below_best), 0.0)
    probs /= probs.sum(axis=1, keepdims=True)
    top_p = np.array([p.top_p for p in params])[:, None]
    probs = np.where(top_p_kept(probs, top_p), probs, 0.0)
    min_p = np.array([p.min_p for p in params])[:, None]
    probs = np.where(probs >= min_p * probs.max(axis=1, keepdims=True), probs, 0.0)
    return probs / probs.sum(axis=1, keepdims=True), order


def top_p_kept(sorted_probs: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Which tokens each row's top-p cut keeps (rows sorted, largest first; ``top_p`` one per row, as a
    column): the smallest prefix whose mass reaches ``top_p`` within ``TOP_P_TOLERANCE``, at least the
    best token; every token when ``top_p`` is 1."""
    before = np.cumsum(sorted_probs, axis=1)
    before = np.concatenate([np.zeros_like(before[:, :1]), before[:, :-1]], axis=1)  # the better tokens' mass
    first = np.arange(sorted_probs.shape[1])[None, :] == 0
    return (top_p >= 1.0) | (before < top_p - TOP_P_TOLERANCE) | first


def top_p_keep(sorted_probs: np.ndarray, top_p: float) -> int:
    """How many of one row's probabilities (sorted, largest first, summing to 1) ``top_p_kept`` keeps."""
    return int(top_p_kept(sorted_probs[None, :], np.array([[top_p]])).sum())
