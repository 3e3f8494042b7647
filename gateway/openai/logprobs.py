"""Log-probabilities in OpenAI's two response forms, from the engine's (token id, ``TokenLogprob``) pairs:
chat's list of tokens (text, log-probability, UTF-8 bytes, alternatives) and legacy completions' parallel
lists with each token's offset in the text. A token's text is its bytes decoded on their own (a token
holding part of a character reads as U+FFFD there; its bytes are exact)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.openai.job import TokenLogprobs
from gateway.openai.schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from sluice.text import TextCodec
from sluice.wire import TokenLogprob


def _text(codec: TextCodec, token_id: int) -> tuple[str, list[int]]:
    raw = codec.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(codec: TextCodec, entries: Sequence[TokenLogprobs]) -> ChatLogprobs:
    content = []
    for token_id, lp in entries:
        text, raw = _text(codec, token_id)
        top = []
        for alt, value in lp.top:
            alt_text, alt_raw = _text(codec, alt)
            top.append(TopLogprob(alt_text, value, alt_raw))
        content.append(ChatTokenLogprob(text, lp.logprob, raw, top))
    return ChatLogprobs(content)


class CompletionLogprobsWriter:
    """One answer's legacy-completions log-probabilities, chunk by chunk: ``text_offset`` runs on across
    the chunks of a stream."""

    def __init__(self, codec: TextCodec) -> None:
        self._codec = codec
        self.offset = 0

    def __call__(self, entries: Sequence[tuple[int, TokenLogprob | None]]) -> CompletionLogprobs:
        """The entries' form; an entry without a log-probability (a prompt's first token) reports null."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for token_id, lp in entries:
            text = _text(self._codec, token_id)[0]
            tokens.append(text)
            values.append(None if lp is None else lp.logprob)
            top = {} if lp is None else {_text(self._codec, alt)[0]: value for alt, value in lp.top}
            tops.append(top or None)
            offsets.append(self.offset)
            self.offset += len(text)
        return CompletionLogprobs(tokens, values, tops, offsets)
