"""The wire types between the gateway and a replica, defined once: what a request's priority is, how a
generation ends, how it fails, what load a replica reports, and the tensor names of the Triton model
that carries them.

Imports nothing from Sluice, and sits below everything that reads it: the gateway, the policies, the
engine clients, the Triton client, the replica's model (model_repository/cpu_engine/1/) and the CPU
engine, which schedules by ``EnginePriority`` and ends its sequences with ``FinishReason`` itself; its
stream errors are its own, and the replica's converters map them to these.

Tensors of the CPU engine's model, the ``cpu_engine`` dialect (``sluice.engine_client.dialects`` maps a
request onto the TensorRT-LLM backend's ``tensorrt_llm`` model instead, whose names these follow where
they overlap, but which takes neither ``random_seed`` nor Sluice's extras below); every tensor has a
leading batch dimension of 1: ``input_ids`` [1, N], ``output_ids`` [1, 1, T]:

=====================  ======  ==================================================================
``input_ids``          INT32   prompt token ids
``input_lengths``      INT32   prompt length; ``input_ids[:input_lengths]`` is the prompt
``request_output_len`` INT32   maximum output tokens
``streaming``          BOOL    one response per step (coalesced) when true; one in all when false
``end_id``             INT32   one more end-of-sequence id (the model's own EOS ids always apply)
``pad_id``             INT32   accepted and ignored (one beam, no padding)
``temperature``        FP32    0 is greedy
``runtime_top_k``      INT32   0 is no top-k cut
``runtime_top_p``      FP32    0 or 1 is no top-p cut
``random_seed``        UINT64  seed for sampling
``stop_token_ids``     INT32   [-1] ids that end the sequence (Sluice's simple ``stop_words_list``)
``priority``           INT32   an ``EnginePriority`` (default 0)
``cache_scope``        BYTES   required: the tenant; prefix-cache blocks are shared only within one scope
``ignore_eos``         BOOL    keep generating past the EOS ids (and ``end_id``)
``min_p``              FP32    0 is no min-p cut
``presence_penalty``   FP32    subtracted once from each token the output holds (OpenAI's)
``frequency_penalty``  FP32    subtracted per occurrence of each token the output holds (OpenAI's)
``repetition_penalty`` FP32    1 is none; divides (multiplies, if negative) the prompt's and output's
``logit_bias_ids``     INT32   [-1] token ids whose logits get a bias (Sluice's sparse ``embedding_bias``)
``logit_bias_values``  FP32    [-1] the bias of each of ``logit_bias_ids``, in [-100, 100]
``guided_decoding_guide_type`` BYTES a ``GuideKind``: constrain the output to a grammar
``guided_decoding_guide``      BYTES the guide (a JSON schema, a regex, a grammar; none for ``json``)
``return_log_probs``   BOOL    report each output token's log-probability (``output_log_probs``)
``top_logprobs``       INT32   and this many most likely alternatives per token (0-20)
``num_return_sequences`` INT32 n answers to one prompt (prefilled once); responses say which
``return_prompt_log_probs`` BOOL also each prompt token's (needs ``return_log_probs``)
=====================  ======  ==================================================================

All inputs are optional but the first three and ``cache_scope`` (config.pbtxt declares it optional only so
that a request without it gets the model's clear error, not Triton's generic one). A request that gives
none of ``temperature``, ``runtime_top_k``, ``runtime_top_p`` is greedy; once any is given, a missing
temperature is 1.0.

Outputs: ``output_ids`` INT32 [1, 1, T] and ``sequence_length`` INT32 [1, 1] (T, the tokens in *this*
response; the prompt is never echoed). The response with an answer's last tokens also has ``finish_reason``
BYTES [1, 1] (a ``FinishReason``), ``num_prompt_tokens`` and ``num_cached_tokens`` INT32 [1, 1] (prompt tokens
served from the prefix cache). With ``return_log_probs``, every response with tokens also has
``output_log_probs`` FP32 [1, 1, T] and, with ``top_logprobs`` K > 0, ``top_logprob_ids`` INT32 and
``top_logprobs`` FP32 [1, 1, T, K] (most likely first): the model's log-softmax before any sampling
adjustment. With ``num_return_sequences`` n > 1 the responses of every answer but the first carry
``sequence_index`` INT32 [1, 1] (1 to n-1; absent: 0), each answer's last response carries its final outputs,
and the request ends when every sequence has. A request the model refuses or fails ends with one response
carrying ``error_kind`` BYTES [1, 1] (an ``EngineErrorKind``) and ``error_message`` BYTES [1, 1] instead. An
empty response flagged final ends every other request.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum


class FinishReason(StrEnum):
    STOP = "stop"  # an end-of-sequence or stop token
    LENGTH = "length"  # max_tokens, or the model's context
    ABORT = "abort"  # cancelled


class GuideKind(StrEnum):
    """What a guided-decoding guide is (structured output): the names TensorRT-LLM's Triton backend takes
    in ``guided_decoding_guide_type``, which the CPU engine's model takes too."""

    JSON = "json"  # any JSON value that is an object (OpenAI's json_object); the guide text is unused
    JSON_SCHEMA = "json_schema"  # the guide is a JSON schema, as JSON text
    REGEX = "regex"
    EBNF_GRAMMAR = "ebnf_grammar"  # a Lark / GBNF grammar


@dataclass(frozen=True)
class Guide:
    """Structured output: the answer must match this guide (a JSON schema as JSON text, a regex, a
    grammar; for ``GuideKind.JSON`` the text is empty: any JSON object)."""

    kind: GuideKind
    text: str = ""


@dataclass(frozen=True)
class TokenLogprob:
    """One output token's log-probability under the model (log-softmax before any sampling adjustment)
    and, when asked, the most likely alternatives at its place, most likely first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, log-probability)


class EnginePriority(IntEnum):
    """The engine's priority class of a request, lower first: the engine admits a waiting request ahead of
    lower classes and preempts running ones of a strictly lower class (a higher value) to make room,
    never ones of its own class or above. The gateway picks it (``sluice.policy.dispatch``); the CPU
    engine schedules by this enum itself, as it reports ``FinishReason``."""

    UNDER_SHARE = 0  # interactive, its tenant well within its share
    OVER_SHARE = 1  # interactive, its tenant holding its share or more: preemptible by the one above
    BATCH = 2


class EngineErrorKind(StrEnum):
    INVALID_REQUEST = "invalid_request"  # the replica refused the request (the caller's fault)
    UNAVAILABLE = "unavailable"  # the replica cannot be reached or is not ready
    ENGINE_ERROR = "engine_error"  # the replica failed mid-request


class EngineError(Exception):
    """A generation that failed; ``kind`` says whose fault, ``message`` says what happened."""

    def __init__(self, kind: EngineErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


REQUIRED_INPUTS = ("input_ids", "input_lengths", "request_output_len")
OPTIONAL_INPUTS = (
    "streaming", "end_id", "pad_id", "temperature", "runtime_top_k", "runtime_top_p", "random_seed",
    "stop_token_ids", "priority", "cache_scope", "ignore_eos", "min_p", "presence_penalty",
    "frequency_penalty", "repetition_penalty", "logit_bias_ids", "logit_bias_values",
    "guided_decoding_guide_type", "guided_decoding_guide", "return_log_probs", "top_logprobs",
    "num_return_sequences", "return_prompt_log_probs",
)  # fmt: skip
INPUT_NAMES = REQUIRED_INPUTS + OPTIONAL_INPUTS
TOKEN_OUTPUTS = ("output_ids", "sequence_length")
LOGPROB_OUTPUTS = ("output_log_probs", "top_logprob_ids", "top_logprobs")
# With return_prompt_log_probs, on an answer's first response: each prompt token's but the first, [1, 1, P-1].
PROMPT_LOGPROB_OUTPUTS = ("prompt_log_probs", "prompt_top_logprob_ids", "prompt_top_logprobs")
FINAL_OUTPUTS = ("finish_reason", "num_prompt_tokens", "num_cached_tokens")
ERROR_OUTPUTS = ("error_kind", "error_message")
OUTPUT_NAMES = (
    TOKEN_OUTPUTS
    + LOGPROB_OUTPUTS
    + PROMPT_LOGPROB_OUTPUTS
    + ("sequence_index",)
    + FINAL_OUTPUTS
    + ERROR_OUTPUTS
)


@dataclass(frozen=True)
class ReplicaStats:
    """A replica's load as its engine reports it (TensorRT-LLM's ``nv_trt_llm_*`` metric families)."""

    num_kv_tokens_total: int
    num_kv_tokens_free: int
    num_waiting: int  # accepted by the engine, not yet running (waiting for KV memory or a slot)
    num_running: int
