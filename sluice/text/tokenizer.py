"""The checkpoint's tokenizer and chat template, loaded once and shared by every request.

``TextCodec.from_checkpoint(dir)`` reads tokenizer.json (HF ``tokenizers``), tokenizer_config.json
(``chat_template``, special tokens) and generation_config.json (end-of-sequence ids). The chat template
is rendered with jinja2 in a sandbox, the way ``transformers`` does (trim_blocks, lstrip_blocks,
``raise_exception``, and its ``tojson`` filter: no HTML escaping, non-ASCII as it is). The template
receives ``tools`` (None, or a list of ``{"type": "function", "function": {...}}``) as Hugging Face's
``apply_chat_template`` gives it.

Special tokens come only from the chat template, never from what a caller wrote: ``encode`` tokenizes
text as plain text (``<|im_end|>`` in it becomes ordinary tokens, not the control token), and
``encode_chat`` renders the template with a placeholder for each message's text, then tokenizes the
template's special-token strings as their ids and everything between them (the template's other text and
the messages' text, joined) as plain text. So a message cannot close its turn and forge a system one, and
an ordinary chat tokenizes exactly as the whole rendered text would (``tokenizers`` splits at special
tokens first, so no merge crosses one either way).

What a message carries as text is a placeholder while the template renders: its ``content``, ``name``,
``tool_call_id``, and its ``tool_calls``' ids, function names and arguments. Tool schemas and a call's
arguments given as an object are JSON the template may inspect (``parameters.properties``, a property's
``type``) and print with ``tojson``: their strings are kept as they are, except one that holds a special
token's text or could complete one with its neighbour (it begins with a special token's end or ends with
a special token's start), which becomes a placeholder standing for its JSON-escaped text.
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
_CALLER_FIELDS = ("content", "name", "tool_call_id")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Hugging Face's ``tojson`` (templates are written for it): Jinja's own escapes HTML characters."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class TextCodec:
    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str | None,
        special_tokens: Mapping[str, Any],
        eos_token_ids: Sequence[int],
        max_context_tokens: int | None = None,
        model_vocab_size: int | None = None,
    ) -> None:
        # Every text is tokenized with special-token strings as plain text; the template's specials are
        # found by ``_specials`` and added as ids.
        self.tokenizer_json = tokenizer.to_str()  # as the checkpoint has it (structured output's tokenizer)
        self._tokenizer = Tokenizer.from_str(self.tokenizer_json)
        self._tokenizer.encode_special_tokens = True
        added = tokenizer.get_added_tokens_decoder()
        self._special_ids = {t.content: i for i, t in added.items() if t.special}
        longest_first = sorted(self._special_ids, key=len, reverse=True)
        # A special token's proper starts and ends: a kept string (module docstring) with one at its edge
        # could complete a special token with the text next to it.
        self._special_starts = tuple({t[:n] for t in self._special_ids for n in range(1, len(t))})
        self._special_ends = tuple({t[n:] for t in self._special_ids for n in range(1, len(t))})
        self._specials = (
            re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if longest_first else None
        )
        # Placeholders for the caller's text while the template renders (that text itself never enters the
        # rendered string): private-use characters around a random tag no template prints by chance.
        self._placeholder_tag = secrets.token_hex(8)
        self._placeholder = re.compile(f"\ue000{self._placeholder_tag}:(\\d+)\ue001")
        self.max_context_tokens = max_context_tokens
        # The model's logits width (config.json's vocab_size; may exceed the tokenizer's): what an engine
        # that takes a dense logit bias needs (TensorRT-LLM's embedding_bias). None: not known.
        self.model_vocab_size = model_vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self._special_tokens = dict(special_tokens)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = _tojson
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
        vocab = model.get("vocab_size")
        return cls(tokenizer, config.get("chat_template"), special, eos, max_context, vocab)

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
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of the chat template applied to ``messages`` (and ``tools``): the template's special
        tokens as their ids, the caller's text as plain text (see ``encode`` and the module docstring).

        ``ChatTemplateError`` if the template cannot render them. NOTE: a template that inspects the text
        (``content.split(...)``) sees a placeholder, not the text.
        """
        texts: list[str] = []
        standins = [self._message_standin(message, texts) for message in messages]
        tool_standins = None if tools is None else [self._json_standin(tool, texts) for tool in tools]
        rendered = self.render_chat(standins, add_generation_prompt, tool_standins)
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

    def _standin(self, text: str, texts: list[str]) -> str:
        """A placeholder for ``text`` (appended to ``texts``)."""
        texts.append(text)
        return f"\ue000{self._placeholder_tag}:{len(texts) - 1}\ue001"

    def _message_standin(self, message: Mapping[str, Any], texts: list[str]) -> dict[str, Any]:
        standin = dict(message)
        for key in _CALLER_FIELDS:
            value = message.get(key)
            if isinstance(value, str) and value:  # "" stays "" (a template may test it)
                standin[key] = self._standin(value, texts)
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            standin["tool_calls"] = [self._call_standin(call, texts) for call in calls]
        return standin

    def _call_standin(self, call: Any, texts: list[str]) -> Any:
        """An assistant message's call: its id, name and text arguments as placeholders, arguments given
        as an object as JSON (``_json_standin``)."""
        if not isinstance(call, Mapping):
            return self._json_standin(call, texts)
        standin = {k: self._json_standin(v, texts) for k, v in call.items()}
        if isinstance(call.get("id"), str) and call["id"]:
            standin["id"] = self._standin(call["id"], texts)
        function = call.get("function")
        if isinstance(function, Mapping):
            standin["function"] = {k: self._json_standin(v, texts) for k, v in function.items()}
            for key in ("name", "arguments"):
                if isinstance(function.get(key), str) and function[key]:
                    standin["function"][key] = self._standin(function[key], texts)
        return standin

    def _json_standin(self, value: Any, texts: list[str]) -> Any:
        """JSON the template may inspect: its strings as they are, but a placeholder (for its JSON-escaped
        text) for one that could make a special token (module docstring)."""
        if isinstance(value, str):
            if self._specials is None or not (
                self._specials.search(value)
                or value.endswith(self._special_starts)
                or value.startswith(self._special_ends)
            ):
                return value
            return self._standin(json.dumps(value, ensure_ascii=False)[1:-1], texts)
        if isinstance(value, Mapping):
            return {self._json_standin(k, texts): self._json_standin(v, texts) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._json_standin(v, texts) for v in value]
        return value

    def decode(self, token_ids: Sequence[int]) -> str:
        """The whole text of ``token_ids`` (special tokens skipped), as the detokenizer would stream it."""
        detok = self.detokenizer()
        return detok.push(token_ids) + detok.finish()

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str:
        if self._template is None:
            raise ChatTemplateError("this model has no chat template; use /v1/completions")
        try:
            return self._template.render(
                messages=list(messages),
                tools=None if tools is None else list(tools),
                add_generation_prompt=add_generation_prompt,
                **self._special_tokens,
            )
        except ChatTemplateError:
            raise
        except (TemplateError, TypeError, KeyError) as exc:
            raise ChatTemplateError(f"the messages do not fit the chat template: {exc}") from None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token's: none), as the detokenizer joins them."""
        return self._token_bytes(token_id)

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self._token_bytes)
