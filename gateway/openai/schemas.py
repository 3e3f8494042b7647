"""The OpenAI wire format (the subset Sluice serves), as msgspec Structs.

Every field OpenAI defines for these requests is declared, so none is dropped without a word:

- honoured: ``model``, ``messages`` / ``prompt`` (completions: a list of prompts too), ``max_tokens`` /
  ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``stream``,
  ``stream_options.include_usage``, ``service_tier`` (``auto``/``default``: interactive, ``flex``:
  batch), ``n``, ``logprobs`` / ``top_logprobs`` (``gateway.openai.logprobs``), ``response_format``
  (``gateway.openai.structured``), ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, the
  extensions ``ignore_eos``, ``top_k``, ``min_p`` and ``repetition_penalty`` (vLLM's names); ``tools``,
  ``tool_choice`` (``none``/``auto``/``required``/a named function), ``parallel_tool_calls``, assistant
  ``tool_calls`` and a tool message's ``tool_call_id`` (``gateway.openai.tools``); for completions
  ``echo`` (with ``logprobs``, the prompt's tokens' log-probabilities come first);
- accepted and ignored, because they do not change the output: ``user``, ``metadata``, ``store`` (Sluice
  stores no completions), ``safety_identifier``, ``prompt_cache_key`` (the prefix cache is per tenant
  anyway), ``stream_options.include_obfuscation``, and the values of refused parameters that mean "off"
  (``modalities: ["text"]``, ``best_of: 1``);
- refused with 400 ``unsupported_parameter`` and ``param`` naming it (``UNSUPPORTED``), because dropping
  them would change the result: ``functions`` / ``function_call`` (the deprecated form of tools),
  ``prediction``, ``audio`` and ``modalities`` other than text, ``web_search_options``,
  ``reasoning_effort``, ``verbosity``; content parts other than text (images, audio, files); assistant
  ``function_call`` / ``audio`` / ``refusal``; for completions ``suffix`` and ``best_of`` > 1.

Any other field is refused with 400 ``unknown_parameter`` (as OpenAI answers "Unrecognized request
argument"): a misspelt or vendor-specific parameter would otherwise be silently ignored.
``first_unknown_field`` finds it in the decoded body.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import msgspec

Role = Literal["system", "developer", "user", "assistant", "tool"]
# OpenAI's rule for a participant's name; it keeps control text (and anything else) out of the prompt.
ParticipantName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content. Only ``text`` parts are served; the other types' fields are
    declared so that they are refused by name rather than as unknown fields."""

    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None
    refusal: str | None = None


# ----- tools (gateway.openai.tools) -----
# OpenAI's rule for a function's name.
FunctionName = Annotated[str, msgspec.Meta(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]


class FunctionDefinition(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A tool's function: ``parameters`` is a JSON schema object (absent: no arguments). With ``strict``
    the parameters must meet OpenAI's rules for a strict schema (gateway/openai/strict_schema.py); a
    forced call (``tool_choice`` ``required`` or named) always follows the schema."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One entry of ``tools``: a function the model may call."""

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True):
    """``tool_choice`` naming the function the model must call (one of ``tools``)."""

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: str  # JSON text, as the model wrote it


class ToolCall(msgspec.Struct, kw_only=True):
    """A call the model made: in an answer's ``message.tool_calls``, and in an assistant message sent back
    in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Role
    content: str | list[ContentPart] | None = None
    name: ParticipantName | None = None
    tool_call_id: str | None = None  # a tool message's: the call it answers (the template may render it)
    tool_calls: list[ToolCall] | None = None  # an assistant message's calls
    function_call: Any = None  # refused
    audio: Any = None  # refused
    refusal: str | None = None  # refused

    def text(self) -> str:
        """The content as one text (its text parts joined); unsupported parts are refused before."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(p.text or "" for p in self.content)


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted, ignored: Sluice pads no chunks


class JsonSchemaFormat(msgspec.Struct, kw_only=True):
    """``response_format.json_schema``: OpenAI's fields. The schema is honoured whatever ``strict`` says
    (Sluice always constrains decoding to it); a strict one must also meet OpenAI's rules for it
    (gateway/openai/strict_schema.py)."""

    name: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, kw_only=True):
    """``text`` (the default), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _SamplingFields(msgspec.Struct, kw_only=True):
    model: str
    max_tokens: int | None = None
    # OpenAI's ranges (a temperature below 1e-5 is greedy).
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)] | None = None
    stop: str | list[str] | None = None
    # Answers to the one prompt, prefilled once (at most SLUICE_MAX_N, checked at admission).
    n: Annotated[int, msgspec.Meta(ge=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # OpenAI's ranges; the penalties count the output's tokens (OpenAI's definition).
    presence_penalty: Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)] | None = None
    # Token id (as a string, OpenAI's form) -> a bias added to its logit; checked against the vocabulary
    # at admission.
    logit_bias: dict[str, Annotated[float, msgspec.Meta(ge=-100.0, le=100.0)]] | None = None
    # Extensions vLLM and TensorRT-LLM clients send: top_k (0 or -1: no cut), min_p, and the repetition
    # penalty (prompt and output tokens; 1: none).
    top_k: Annotated[int, msgspec.Meta(ge=-1, le=2**31 - 1)] | None = None
    min_p: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0, le=2.0)] | None = None
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
    # Each output token's log-probability, and this many most likely alternatives at its place.
    logprobs: bool | None = None
    top_logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    # At most 128 tools; tool_choice defaults to "auto" with tools, "none" without (gateway.openai.tools).
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: ResponseFormat | None = None
    prediction: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    web_search_options: Any = None
    reasoning_effort: str | None = None
    verbosity: str | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    # A text, token ids, or a list of texts or of token-id lists (one answer set per prompt).
    prompt: str | list[str | int | list[int]]
    # Each output token's log-probability and this many most likely alternatives (0: the token's own).
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None


def _is_set(value: Any) -> bool:
    return value is not None


def _is_on(value: Any) -> bool:
    return bool(value)


def _not_none_mode(value: Any) -> bool:
    return value is not None and value != "none"


# (field, when it is refused, what the client is told): checked in this order.
_Check = tuple[str, Any, str]
_COMMON: tuple[_Check, ...] = ()
_CHAT: tuple[_Check, ...] = (
    ("functions", _is_on, "functions are not supported."),
    ("function_call", _not_none_mode, "function_call is not supported (no functions)."),
    ("prediction", _is_set, "Predicted outputs are not supported."),
    ("audio", _is_set, "Audio output is not supported."),
    ("modalities", lambda v: v is not None and set(v) - {"text"}, "Only the text modality is supported."),
    ("web_search_options", _is_set, "Web search is not supported."),
    ("reasoning_effort", _is_set, "reasoning_effort is not supported: this model does not reason."),
    ("verbosity", _is_set, "verbosity is not supported."),
)
_COMPLETION: tuple[_Check, ...] = (
    ("suffix", _is_on, "suffix is not supported."),
    ("best_of", lambda v: v is not None and v != 1, "Only best_of=1 is supported."),
)
_MESSAGE: tuple[_Check, ...] = (
    ("function_call", _is_set, "Assistant function_call is not supported (no functions)."),
    ("audio", _is_set, "Assistant audio is not supported."),
    ("refusal", _is_set, "Assistant refusal messages are not supported; send the text as content."),
)
UNSUPPORTED_CHAT = tuple(name for name, _, _ in _COMMON + _CHAT)
UNSUPPORTED_COMPLETION = tuple(name for name, _, _ in _COMMON + _COMPLETION)
# Accepted and ignored: they do not change the output.
IGNORED = ("user", "metadata", "store", "safety_identifier", "prompt_cache_key",
           "stream_options.include_obfuscation")  # fmt: skip


def parameters_doc(chat: bool) -> str:
    """The OpenAPI description's paragraph on parameters (Markdown), from the lists above."""
    refused = ", ".join(f"`{n}`" for n in (UNSUPPORTED_CHAT if chat else UNSUPPORTED_COMPLETION))
    ignored = ", ".join(f"`{n}`" for n in IGNORED)
    off = '`modalities: ["text"]`' if chat else "`best_of: 1`"
    if chat:
        refused += (
            ", content parts other than `text` (images, audio, files), and assistant `function_call` / "
            "`audio` / `refusal`"
        )
    logprobs = (
        "`logprobs` (true) with `top_logprobs` (0-20)"
        if chat
        else "`logprobs` (0-5 alternatives; with `echo`, the prompt's tokens' too)"
    )
    text = (
        "Parameters honoured besides OpenAI's basics: `n` (up to `SLUICE_MAX_N`, 8 by default; the prompt is "
        f"prefilled once and billed once), {logprobs} (the model's log-probabilities before any sampling "
        "adjustment), the sampling controls `presence_penalty`, `frequency_penalty`, "
        "`logit_bias` (token id -> -100..100), and vLLM's `top_k`, `min_p`, `repetition_penalty`, "
        "`ignore_eos`"
        + (
            "; `response_format` `json_object` and `json_schema` (`strict` or not: decoding is always "
            "constrained to the schema; compact JSON; a schema that cannot be compiled is 400 "
            "`invalid_response_format`; a `strict` one must meet OpenAI's rules for it, "
            "`additionalProperties: false` and every property `required` in every object, or it is 400 "
            "in OpenAI's words)"
            if chat
            else "; `echo` (the text begins with the prompt)"
        )
        + ". "
        f"Parameters refused with 400 `unsupported_parameter` (`param` names it), because dropping them "
        f'would change the result: {refused}; each is accepted at its "off" value ({off}). Accepted '
        f"and ignored: {ignored}. Any other field: 400 `unknown_parameter`. "
    )
    if chat:
        text += (
            "Roles: system, developer (rendered as the template's system turn), user, assistant, tool; "
            "`name` must match `^[A-Za-z0-9_-]{1,64}$` and is screened with the content. "
            "Tools: `tools` (at most 128 functions, each `parameters` a JSON schema), `tool_choice` "
            "(`none`, `auto`: the model's own calls, read by its version's tool-call parser; `required` "
            "or a named function: the call's arguments are decoded against the function's schema) and "
            "`parallel_tool_calls`; assistant `tool_calls` and `tool` messages (`tool_call_id` required) "
            "are rendered by the chat template and screened like any other text. "
        )
    return text + (
        "Text is tokenized as plain text: special tokens come only from the chat template. Limits: JSON "
        "nested at most 64 deep (400 `json_too_deep`), prompt text at most `SLUICE_MAX_PROMPT_CHARS` "
        "characters before tokenizing (400 `context_length_exceeded`), 4 stop strings of at most 256 "
        "characters each; a temperature below 1e-5 is greedy."
    )


def unsupported_params(req: ChatCompletionRequest | CompletionRequest) -> tuple[str, str] | None:
    """(param, message) for the first parameter Sluice cannot honour, or None."""
    checks = _COMMON + (_CHAT if isinstance(req, ChatCompletionRequest) else _COMPLETION)
    for name, refused, message in checks:
        if refused(getattr(req, name)):
            return name, message
    if isinstance(req, ChatCompletionRequest):
        for i, m in enumerate(req.messages):
            for name, refused, message in _MESSAGE:
                if refused(getattr(m, name)):
                    return f"messages[{i}].{name}", message
            for j, part in enumerate(m.content if isinstance(m.content, list) else []):
                if part.type != "text":
                    return f"messages[{i}].content[{j}]", (
                        f"Content parts of type {part.type!r} are not supported; only 'text' parts are."
                    )
                if part.text is None:
                    return f"messages[{i}].content[{j}].text", "A text content part needs its text."
    return None


@functools.cache  # NOTE: msgspec.structs.fields introspects the type hints: ~1 ms per call
def _field_names(struct: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(f.encode_name for f in msgspec.structs.fields(struct))


_NESTED: dict[type[msgspec.Struct], dict[str, type[msgspec.Struct]]] = {
    ChatCompletionRequest: {
        "messages": ChatMessage,
        "stream_options": StreamOptions,
        "response_format": ResponseFormat,
        "tools": Tool,
        "tool_choice": NamedToolChoice,  # a string choice has no fields
    },
    Tool: {"function": FunctionDefinition},
    NamedToolChoice: {"function": NamedFunction},
    ToolCall: {"function": FunctionCall},
    ResponseFormat: {"json_schema": JsonSchemaFormat},
    CompletionRequest: {"stream_options": StreamOptions},
    ChatMessage: {"content": ContentPart, "tool_calls": ToolCall},
}


def first_unknown_field(body: Any, struct: type[msgspec.Struct], path: str = "") -> str | None:
    """The path (``messages[0].foo``) of the first field of the decoded ``body`` that ``struct`` (or a
    Struct nested in it) does not declare, or None. The body has already been converted to ``struct``,
    so its shape is known to fit."""
    if not isinstance(body, dict):
        return None
    known = _field_names(struct)
    nested = _NESTED.get(struct, {})
    for key, value in body.items():
        if key not in known:
            return f"{path}{key}"
        inner = nested.get(key)
        if inner is not None:
            for item_path, item in _items(value, f"{path}{key}"):
                found = first_unknown_field(item, inner, f"{item_path}.")
                if found is not None:
                    return found
    return None


def _items(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, list):
        yield from ((f"{path}[{i}]", item) for i, item in enumerate(value))
    else:
        yield path, value


# ----- responses -----
class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ResponseMessage(msgspec.Struct, omit_defaults=True):
    role: Literal["assistant"]
    content: str | None  # None: an answer that is only tool calls
    tool_calls: list[ToolCall] | None = None  # omitted when the model called no tool


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(msgspec.Struct):
    """One output token as OpenAI's chat reports it: its text, log-probability, UTF-8 bytes (a token may
    hold part of a character) and the most likely alternatives at its place."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[ChatTokenLogprob] | None
    refusal: list[ChatTokenLogprob] | None = None


class CompletionLogprobs(msgspec.Struct):
    """Legacy completions' form: parallel lists, one entry per token; ``text_offset`` is where each
    token's text starts in the choice's text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ChatChoice(msgspec.Struct):
    index: int
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: Literal["chat.completion"] = "chat.completion"
    system_fingerprint: str | None = None


class ChoiceDeltaFunction(msgspec.Struct, omit_defaults=True):
    name: str | None = None  # on the call's first delta
    arguments: str | None = None  # the next fragment of the arguments' JSON text


class ChoiceDeltaToolCall(msgspec.Struct, omit_defaults=True):
    """A piece of a streamed tool call (OpenAI's): ``id``, ``type`` and the function's ``name`` on the
    call's first delta, then fragments of its ``arguments``; ``index`` says which call it extends."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChoiceDeltaFunction | None = None


class ChoiceDelta(msgspec.Struct, omit_defaults=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[ChoiceDeltaToolCall] | None = None


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChoiceDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | None = None
    system_fingerprint: str | None = None


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: Literal["text_completion"] = "text_completion"
    usage: Usage | None = None
    system_fingerprint: str | None = None


class Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    object: Literal["model"] = "model"


class ModelList(msgspec.Struct):
    data: list[Model]
    object: Literal["list"] = "list"
