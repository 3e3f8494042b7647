"""The checkpoint's tokenizer and chat template, loaded once and shared by every request.

``TextCodec.from_checkpoint(dir)`` reads tokenizer.json (HF ``tokenizers``), tokenizer_config.json
(``chat_template``, special tokens) and generation_config.json (end-of-sequence ids). The chat template
is rendered with jinja2 in a sandbox, the way ``transformers`` does (trim_blocks, lstrip_blocks,
``raise_exception``), and the rendered text is tokenized with its special tokens recognised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from sluice.text.detokenizer import IncrementalDetokenizer, TokenBytes


class ChatTemplateError(ValueError):
    """The messages cannot be rendered by the model's chat template (the caller's fault)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


class TextCodec:
    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        special_tokens: Mapping[str, Any],
        eos_token_ids: Sequence[int],
        max_context_tokens: int | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.max_context_tokens = max_context_tokens
        self.eos_token_ids = tuple(eos_token_ids)
        self._special_tokens = dict(special_tokens)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        self._template = env.from_string(chat_template) if chat_template else None
        added = tokenizer.get_added_tokens_decoder()
        special = {i: t.content for i, t in added.items() if t.special}
        self._token_bytes = TokenBytes(tokenizer.get_vocab(with_added_tokens=True), special)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> TextCodec:
        root = Path(checkpoint_dir)
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        config = json.loads((root / "tokenizer_config.json").read_text())
        eos: list[int] = []
        gen_path = root / "generation_config.json"
        if gen_path.exists():
            raw = json.loads(gen_path.read_text()).get("eos_token_id", [])
            eos = [raw] if isinstance(raw, int) else list(raw)
        special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
        max_context = config.get("model_max_length")
        model_path = root / "config.json"
        if model_path.exists():
            max_context = json.loads(model_path.read_text()).get("max_position_embeddings", max_context)
        return cls(tokenizer, config.get("chat_template"), special, eos, max_context)

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it become their ids, nothing is added."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The whole text of ``token_ids`` (special tokens skipped), as the detokenizer would stream it."""
        detok = self.detokenizer()
        return detok.push(token_ids) + detok.finish()

    def render_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        try:
            return self._template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt, **self._special_tokens
            )
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, KeyError) as exc:
            raise ChatTemplateError(f"the messages do not fit the chat template: {exc}") from None

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self._token_bytes)
