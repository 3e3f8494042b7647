"""Structured output: a request's guide (a JSON schema, a regex, a grammar) as a token mask per step.

llguidance does the work (bench/grammar_choice.py measured it against outlines-core; xgrammar needs torch,
which the replica does not carry). ``GrammarCompiler`` holds the model's tokenizer in llguidance's form and
a bounded cache of compiled guides: a sequence gets a copy of the cached matcher (microseconds) rather than
a compile (a millisecond to seconds). ``allowed_tokens`` computes the masks of a step's constrained rows in
one call (llguidance's own thread pool, outside the GIL).

How a guide becomes a grammar, and the bounds on compiling it, are ``sluice.guides``'s: the gateway
checks a guide with the same rules before any engine work.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import llguidance
import llguidance.numpy as llg_numpy
import numpy as np

from sluice.guides import COMPILE_LIMITS, GrammarError, grammar_text
from sluice.wire import Guide

CACHE_SIZE = 256


class GrammarCompiler:
    """Compiles guides for one tokenizer and keeps the last ``cache_size`` compiled (least recently used
    dropped first). Not thread-safe: the engine's thread owns it."""

    def __init__(
        self, tokenizer_json: str, eos_token_ids: list[int], vocab_size: int, cache_size: int = CACHE_SIZE
    ) -> None:
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, eos_token=eos_token_ids)
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        self._cache: OrderedDict[Guide, llguidance.LLMatcher] = OrderedDict()
        self._cache_size = cache_size
        self._executor = llguidance.LLExecutor()
        self.num_compiled = 0

    @classmethod
    def for_checkpoint(
        cls, path: str | Path, eos_token_ids: list[int], vocab_size: int
    ) -> GrammarCompiler | None:
        """The compiler for the checkpoint at ``path``, or None if it has no tokenizer.json (such a model
        refuses guided requests)."""
        tokenizer = Path(path) / "tokenizer.json"
        if not tokenizer.is_file():
            return None
        return cls(tokenizer.read_text(encoding="utf-8"), eos_token_ids, vocab_size)

    def matcher(self, guide: Guide) -> llguidance.LLMatcher:
        """A fresh matcher for ``guide`` (its own state, at the start). Raises ``GrammarError``."""
        compiled = self._cache.get(guide)
        if compiled is None:
            compiled = llguidance.LLMatcher(
                self.tokenizer, grammar_text(guide), log_level=0, limits=COMPILE_LIMITS
            )
            if compiled.is_error():
                raise GrammarError(f"the {guide.kind.value} guide cannot be used: {compiled.get_error()}")
            self.num_compiled += 1
            self._cache[guide] = compiled
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(guide)
        return compiled.deep_copy()

    def allowed_tokens(self, matchers: list[llguidance.LLMatcher]) -> np.ndarray:
        """Which tokens each matcher allows next: bool [len(matchers), vocab_size]. Ids past the
        tokenizer's vocabulary are never allowed; the end-of-sequence ids are where the guide accepts."""
        bitmask = llg_numpy.allocate_token_bitmask(len(matchers), self.tokenizer.vocab_size)
        if len(matchers) == 1:
            llg_numpy.fill_next_token_bitmask(matchers[0], bitmask)
        else:
            llg_numpy.fill_next_token_bitmask_par(
                self._executor, [(m, i) for i, m in enumerate(matchers)], bitmask
            )
        bits = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little").view(np.bool_)
        allowed = np.zeros((len(matchers), self.vocab_size), dtype=np.bool_)
        width = min(self.vocab_size, self.tokenizer.vocab_size)
        allowed[:, :width] = bits[:, :width]
        return allowed


def consume(matcher: llguidance.LLMatcher, token: int) -> None:
    """Advance ``matcher`` past the sampled ``token`` (always one it allowed). A failure is the engine's
    bug or the library's, never the caller's: raised as a RuntimeError naming the matcher's error."""
    if not matcher.consume_token(token):
        raise RuntimeError(f"the structured-output matcher refused token {token}: {matcher.get_error()}")
