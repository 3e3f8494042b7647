"""Turns one step's schedule into the model's flat input arrays, runs it and samples the next tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cpu_engine.grammar import GrammarCompiler, consume
from cpu_engine.model import LlamaModel
from cpu_engine.sampling import sample_tokens, token_logprobs
from cpu_engine.sequence import Sequence
from cpu_engine.step_plan import SchedulerOutput
from sluice.wire import TokenLogprob


@dataclass(frozen=True)
class StepSamples:
    """What a step sampled, by sequence key: the next token, and its log-probabilities where asked."""

    tokens: dict[str, int]
    logprobs: dict[str, TokenLogprob]


class ModelRunner:
    def __init__(
        self, model: LlamaModel, block_size_tokens: int, grammar: GrammarCompiler | None = None
    ) -> None:
        self.model = model
        self.block_size_tokens = block_size_tokens
        self.grammar = grammar

    def execute(self, out: SchedulerOutput) -> StepSamples:
        """Run the step; sample the next token of every sequence whose chunk reached its last token (and
        the first token of each sibling waiting on it: an answer of the same prompt, n > 1)."""
        if out.block_copies:
            self.model.kv.copy_blocks(out.block_copies)
        bs = self.block_size_tokens
        num_seqs = len(out.scheduled)
        max_blocks = max(len(seq.block_table) for seq, _ in out.scheduled)
        block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
        ids: list[int] = []
        positions_parts: list[np.ndarray] = []
        seq_index_parts: list[np.ndarray] = []
        logits_indices: list[int] = []
        sampling_seqs: list[Sequence] = []
        rows: list[int] = []  # each sampled sequence's row of the logits (siblings share their parent's)
        for i, (seq, num_new) in enumerate(out.scheduled):
            start = seq.num_computed_tokens
            block_tables[i, : len(seq.block_table)] = seq.block_table
            ids.extend(seq.token_ids[start : start + num_new])
            positions_parts.append(np.arange(start, start + num_new, dtype=np.int32))
            seq_index_parts.append(np.full(num_new, i, dtype=np.int32))
            if start + num_new == seq.num_tokens:  # this chunk ends the known tokens: sample the next one
                logits_indices.append(len(ids) - 1)
                for member in (seq, *seq.siblings):
                    sampling_seqs.append(member)
                    rows.append(len(logits_indices) - 1)
        # Rows for prompt log-probabilities: each prompt position computed now predicts the next prompt token.
        num_sampling_rows = len(logits_indices)
        prompt_rows: list[tuple[Sequence, int]] = []  # (sequence, how many rows it owns, in order)
        flat = 0
        for seq, num_new in out.scheduled:
            if seq.wants_prompt_logprobs:
                start = seq.num_computed_tokens
                first = max(start, len(seq.prompt_logprobs))  # position p predicts prompt token p + 1
                last = min(start + num_new, seq.num_prompt_tokens - 1)
                logits_indices.extend(flat + p - start for p in range(first, last))
                prompt_rows.append((seq, max(0, last - first)))
            flat += num_new
        positions = np.concatenate(positions_parts)
        seq_index = np.concatenate(seq_index_parts)
        slot_mapping = block_tables[seq_index, positions // bs].astype(np.int64) * bs + positions % bs
        logits = self.model.forward(
            np.asarray(ids, dtype=np.int64),
            positions,
            seq_index,
            block_tables,
            slot_mapping,
            np.asarray(logits_indices, dtype=np.int64),
        )
        if prompt_rows:
            self._prompt_logprobs(logits[num_sampling_rows:], prompt_rows)
            logits = logits[:num_sampling_rows]
        if not sampling_seqs:
            return StepSamples({}, {})
        if len(rows) != len(logits_indices):
            logits = logits[rows]  # a copy: each sibling's row is its own from here on
        reporting = [i for i, s in enumerate(sampling_seqs) if s.params.logprobs is not None]
        raw = logits[reporting] if reporting else None  # (a copy) the model's own, before any adjustment
        guided = [i for i, s in enumerate(sampling_seqs) if s.matcher is not None]
        if guided:
            self._mask_guided(logits, [sampling_seqs[i] for i in guided], guided)
        params = [s.params for s in sampling_seqs]
        # The penalties read each row's tokens so far (by reference: no copy unless a row needs them).
        histories = [(s.token_ids, s.num_prompt_tokens) for s in sampling_seqs]
        tokens = sample_tokens(logits, params, [s.generator for s in sampling_seqs], histories)
        for i in guided:
            matcher = sampling_seqs[i].matcher
            assert matcher is not None
            consume(matcher, int(tokens[i]))
        logprobs: dict[str, TokenLogprob] = {}
        if raw is not None:
            wanted = [sampling_seqs[i].params.logprobs or 0 for i in reporting]
            for i, (value, top) in zip(
                reporting, token_logprobs(raw, tokens[reporting], wanted), strict=True
            ):
                logprobs[sampling_seqs[i].key] = TokenLogprob(value, top)
        return StepSamples({seq.key: int(t) for seq, t in zip(sampling_seqs, tokens, strict=True)}, logprobs)

    @staticmethod
    def _prompt_logprobs(logits: np.ndarray, owners: list[tuple[Sequence, int]]) -> None:
        """Append each prompt position's log-probability of the next prompt token to its sequence."""
        row = 0
        for seq, count in owners:
            start = len(seq.prompt_logprobs)
            nexts = np.asarray(seq.token_ids[start + 1 : start + 1 + count], dtype=np.int64)
            k = seq.params.logprobs or 0
            for value, top in token_logprobs(logits[row : row + count], nexts, [k] * count):
                seq.prompt_logprobs.append(TokenLogprob(value, top))
            row += count

    def _mask_guided(self, logits: np.ndarray, seqs: list[Sequence], rows: list[int]) -> None:
        """Set to -inf, in place, the logits of every token a guided row's grammar does not allow next."""
        assert self.grammar is not None  # the engine gives a sequence a matcher only when it has a grammar
        allowed = self.grammar.allowed_tokens([s.matcher for s in seqs if s.matcher is not None])
        logits[rows] = np.where(allowed, logits[rows], -np.inf)
