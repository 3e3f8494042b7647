"""The checkpoint's tokenizer and chat template, loaded once and shared by every request.

``TextCodec.from_checkpoint(dir)`` reads tokenizer.json (HF ``tokenizers``), tokenizer_config.json
(``chat_template``, special tokens) and generation_config.json (end-of-sequence ids). The chat template
is rendered with jinja2 in a sandbox, the way ``transformers`` does (trim_blocks, lstrip_blocks,
``raise_exception``).

Special tokens come only from the chat template, never from what a caller wrote: ``encode`` tokenizes
text as plain text (``<|im_end|>`` in it becomes ordinary tokens, not the control token), and
``encode_chat`` renders the template with a placeholder for each message's text, then tokenizes the
template's special-token strings as their ids and everything between them (the template's other text and
the messages' text, joined) as plain text. So a message cannot close its turn and forge a system one, and
an ordinary chat tokenizes exactly as the whole rendered text would (``tokenizers`` splits at special
tokens first, so no merge crosses one either way).
"""

from __future__ import annotations

import json
import re
import secrets
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


# What a message may carry into the template as the caller's text (each is replaced by a placeholder).
_CALLER_FIELDS = ("content", "name")


class TextCodec:
    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        special_tokens: Mapping[str, Any],
        eos_token_ids: Sequence[int],
        max_context_tokens: int | None = None,
    ) -> None:
        # Every text is tokenized with special-token strings as plain text; the template's specials are
        # found by ``_specials`` and added as ids.
        self.tokenizer_json = tokenizer.to_str()  # as the checkpoint has it (structured output's tokenizer)
        self._tokenizer = Tokenizer.from_str(self.tokenizer_json)
        self._tokenizer.encode_special_tokens = True
        added = tokenizer.get_added_tokens_decoder()
        self._special_ids = {t.content: i for i, t in added.items() if t.special}
        longest_first = sorted(self._special_ids, key=len, reverse=True)
        self._specials = (
            re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if longest_first else None
        )
        # Placeholders for the caller's text while the template renders (that text itself never enters the
        # rendered string): private-use characters around a random tag no template prints by chance.
        self._placeholder_tag = secrets.token_hex(8)
        self._placeholder = re.compile(f"\ue000{self._placeholder_tag}:(\\d+)\ue001")
        self.max_context_tokens = max_context_tokens
        self.eos_token_ids = tuple(eos_token_ids)
        self._special_tokens = dict(special_tokens)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        self._template = env.from_string(chat_template) if chat_template else None
        special = {i: t.content for i, t in added.items() if t.special}
        self._token_bytes = TokenBytes(tokenizer.get_vocab(with_added_tokens=True), special)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path) -> TextCodec:
        root = Path(checkpoint_dir)
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        config = json.loads((root / "tokenizer_config.json").read_text())
        model_path = root / "config.json"
        model = json.loads(model_path.read_text()) if model_path.exists() else {}
        # The end-of-sequence ids: generation_config.json's, else config.json's (as the CPU engine does).
        gen_path = root / "generation_config.json"
        generation = json.loads(gen_path.read_text()) if gen_path.exists() else {}
        raw = generation.get("eos_token_id", model.get("eos_token_id"))
        eos = [] if raw is None else [raw] if isinstance(raw, int) else list(raw)
        special = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
        max_context = model.get("max_position_embeddings", config.get("model_max_length"))
        return cls(tokenizer, config.get("chat_template"), special, eos, max_context)

    @property
    def vocab_size(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: a special-token string in it is ordinary text (never the
        control token), and nothing is added."""
        # NOTE: encode_batch_fast releases the GIL while it tokenizes (encode does not), so a large text
        # encoded in a worker thread leaves the event loop running; "fast": without character offsets.
        token_ids: list[int] = self._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return token_ids

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of the chat template applied to ``messages``: the template's special tokens as their
        ids, each message's ``content`` and ``name`` as plain text (see ``encode``).

        ``ChatTemplateError`` if the template cannot render them. NOTE: a template that inspects the text
        (``content.split(...)``) sees a placeholder, not the text.
        """
        texts: list[str] = []
        standins = []
        for message in messages:
            standin = dict(message)
            for key in _CALLER_FIELDS:
                value = message.get(key)
                if isinstance(value, str):
                    standin[key] = f"\ue000{self._placeholder_tag}:{len(texts)}\ue001"
                    texts.append(value)
            standins.append(standin)
        rendered = self.render_chat(standins, add_generation_prompt)
        token_ids: list[int] = []
        between: list[str] = []  # plain text since the last special token
        # re.split alternates text and what the pattern captured (a placeholder's index, a special token).
        for i, template_text in enumerate(self._placeholder.split(rendered)):
            if i % 2:
                between.append(texts[int(template_text)])
                continue
            pieces = self._specials.split(template_text) if self._specials else [template_text]
            for j, piece in enumerate(pieces):
                if j % 2:
                    token_ids.extend(self.encode("".join(between)))
                    between.clear()
                    token_ids.append(self._special_ids[piece])
                else:
                    between.append(piece)
        token_ids.extend(self.encode("".join(between)))
        return token_ids

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
