"""The OpenAI wire format (the subset Sluice serves), as msgspec Structs.

Requests accept fields the client libraries send and Sluice ignores (``user``, ``logit_bias``...);
fields whose meaning Sluice cannot honour are refused by ``unsupported_params`` with a clear message.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class TextPart(msgspec.Struct):
    type: str
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text or "" for p in self.content)


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    logprobs: bool | int | None = None
    # Extension (vLLM's name): keep generating past end-of-sequence, for benchmarks with fixed lengths.
    ignore_eos: bool = False
    # OpenAI's: "auto"/"default" (or absent) is the interactive class; "flex" is the batch class.
    service_tier: str | None = None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    prompt: str | list[str | int]  # text, [text] or token ids (msgspec allows one array type)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


def unsupported_params(req: ChatCompletionRequest | CompletionRequest) -> tuple[str, str] | None:
    """(param, message) for the first parameter Sluice cannot honour, or None."""
    if req.n is not None and req.n != 1:
        return "n", "Only n=1 is supported: ask for one choice per request."
    if req.logprobs:
        return "logprobs", "logprobs are not supported."
    if req.presence_penalty or req.frequency_penalty:
        return "presence_penalty", "presence_penalty and frequency_penalty are not supported."
    if req.logit_bias:
        return "logit_bias", "logit_bias is not supported."
    if isinstance(req, ChatCompletionRequest):
        if req.tools:
            return "tools", "Tools are not supported."
        if req.response_format and req.response_format.get("type", "text") != "text":
            return "response_format", "Only response_format {'type': 'text'} is supported."
    else:
        if req.echo:
            return "echo", "echo is not supported."
        if req.suffix:
            return "suffix", "suffix is not supported."
        if req.best_of is not None and req.best_of != 1:
            return "best_of", "Only best_of=1 is supported."
    return None


# ----- responses -----
class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseMessage(msgspec.Struct):
    role: Literal["assistant"]
    content: str


class ChatChoice(msgspec.Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class ChoiceDelta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChoiceDelta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None = None


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    usage: Usage | None = None


class Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct):
    data: list[Model]
    object: Literal["list"] = "list"
