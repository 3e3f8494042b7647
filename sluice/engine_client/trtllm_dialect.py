"""The ``tensorrt_llm`` dialect: a ``GenerateRequest`` as the input tensors of TensorRT-LLM's Triton
backend model (tensorrtllm_backend's ``tensorrt_llm``, ``model_repository/trtllm/tensorrt_llm/``), and
its responses as ``Delta``s. Pure: no I/O (``sluice.engine_client.triton`` drives it).

Every name, dtype and shape below was read in TensorRT-LLM's own source (the release Sluice pins,
``build_engines.trtllm_release``: 1.2.0), ``triton_backend/inflight_batcher_llm/src/`` (``utils.h``
InputFieldsNames, ``utils.cc`` createRequestsFromInputTensors / getSamplingConfigFromTensors,
``model_instance_state.cc`` fillTritonResponse) and ``triton_backend/all_models/inflight_batcher_llm/
tensorrt_llm/config.pbtxt``; tests/build_engines/test_trtllm_contract.py holds each to its file.

======================  =====================================  ===========================================
Sampling / request      backend input                          note
======================  =====================================  ===========================================
max_tokens              request_output_len INT32
temperature             temperature FP32                       greedy sends none and runtime_top_k 1
top_k                   runtime_top_k INT32                    0: no cut; above TOP_K_MAX (1024) refused
top_p                   runtime_top_p FP32                     at least MIN_SENT_TOP_P (0 is "no cut")
seed                    seed UINT64
repetition_penalty      repetition_penalty FP32                prompt and output tokens, as transformers
logit_bias              embedding_bias FP32 [vocab_size]       dense: needs ``GenerateRequest.vocab_size``
guide                   guided_decoding_guide_type / _guide    BYTES; xgrammar does the masking
logprobs (0)            return_log_probs BOOL                  -> output_log_probs -> ``Delta.logprobs``
n                       num_return_sequences INT32             refused on 1.2.0 (see below)
eos_token_ids           end_id / pad_id INT32, stop_words      the first EOS id is end_id, the rest stop
stop_token_ids          stop_words_list INT32 [2, N]           single-token words
======================  =====================================  ===========================================

Refused (``EngineError`` INVALID_REQUEST naming the parameter and why), never dropped:

- ``min_p``: getSamplingConfigFromTensors reads no min-p input (the executor's SamplingConfig has one, the
  Triton backend never sets it).
- ``presence_penalty`` and ``frequency_penalty``: the engine counts the prompt's tokens too (penaltyKernels.cu
  fills its counts from the whole sequence), where OpenAI counts only the output's. The executor can be
  told to skip the prompt (SamplingConfig's promptIgnoreLength), but the 1.2.0 Triton backend has no input
  for it (``prompt_ignore_length`` came with NVIDIA/TensorRT-LLM#13633, after 1.2.0).
- ``n`` > 1: the 1.2.0 backend passes 17 positional arguments to a 20-parameter SamplingConfig constructor
  (utils.cc getSamplingConfigFromTensors; NVIDIA/TensorRT-LLM#13633 says so for 1.2.0rc4 and 1.2.0 GA), so
  ``num_return_sequences`` lands in ``noRepeatNgramSize``: one answer comes back, with every repeated
  n-gram of that size banned. ``NUM_RETURN_SEQUENCES_CARRIED`` turns the mapping on for a release that
  fixed it; the decoder already reads ``sequence_index``.
- ``logprobs`` K > 0 (alternatives): the backend returns each sampled token's log-probability only
  (``output_log_probs``), never the most likely alternatives.
- an ``ebnf_grammar`` guide: the engine's guided decoder is xgrammar (guidedDecoder.cpp: the C++ runtime
  refuses llguidance), whose EBNF is not the Lark grammar Sluice's gateway and CPU engine accept.
- a guide with ``ignore_eos``: a finished guide allows only the end token (as the CPU engine refuses it).

What the numbers mean: the engine applies ``embedding_bias``, the temperature and the penalties to the
logits in place before it samples (penaltyKernels.cu batchApplyPenalty: bias, then temperature, then
penalties; the guide's mask after), and ``output_log_probs`` is the log of the sampled token's probability
under those adjusted logits. So the log-probabilities are AFTER temperature, penalties and logit_bias,
where OpenAI and vLLM report the model's own log-softmax before them; with ``normalize_log_probs`` false
(rendered so by build_engines) they are over the whole vocabulary, not renormalised over the top-k/top-p
set (the backend's default, under which every greedy token reads 0).

Also not carried (module ``sluice.engine_client.dialects``): the request priority and the tenant's cache
scope. Responses carry no finish reason: the decoder gives each answer's final delta its reason
(``length`` when max_tokens were produced, ``stop`` otherwise).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from sluice.engine_client.base import Delta, GenerateRequest, Sampling
from sluice.wire import EngineError, EngineErrorKind, FinishReason, Guide, GuideKind, TokenLogprob

# top_p travels as FP32, where a tiny value rounds to 0, which TensorRT-LLM reads as "no cut" (the whole
# distribution). Any top_p at or below this keeps only the most likely token (whose probability is at
# least 1 / vocabulary size), so it is sent as this instead.
MIN_SENT_TOP_P = 1e-6

# The largest top-k the engine's sampler takes (cpp/tensorrt_llm/kernels/samplingTopKKernels.h TOP_K_MAX);
# a larger one is clamped to it with a warning (TopKSamplingLayer::setup), a narrower cut than asked.
TOP_K_MAX = 1024

# Whether the pinned release's Triton backend passes num_return_sequences to the engine as such (module
# docstring: 1.2.0 does not). A release with NVIDIA/TensorRT-LLM#13633 may set it True.
NUM_RETURN_SEQUENCES_CARRIED = False

# The tensorrt_llm model's output tensors a response is decoded from (fillTritonResponse): the tokens, and
# when asked the log-probabilities and (n > 1) which answer the response is of.
TRTLLM_OUTPUTS = ("output_ids", "sequence_length", "output_log_probs", "sequence_index")

# GuideKind -> the backend's guided_decoding_guide_type (utils.cc getGuidedDecodingParamsFromTensors maps
# "json", "json_schema", "regex", "ebnf_grammar"; any other string is silently no guide). JSON is sent as the
# schema of any object: the backend's "json" is xgrammar's built-in JSON grammar (guidedDecoder.cpp
# CompileBuiltinJSONGrammar), which does not promise an object, and OpenAI's json_object is one.
_GUIDE_TYPES = {GuideKind.JSON: "json_schema", GuideKind.JSON_SCHEMA: "json_schema", GuideKind.REGEX: "regex"}
_ANY_OBJECT = json.dumps({"type": "object"})


def _refusal(parameter: str, why: str) -> EngineError:
    return EngineError(
        EngineErrorKind.INVALID_REQUEST,
        f"{parameter} is not supported by this model's engine (TensorRT-LLM): {why}",
    )


def _sent_top_p(request: GenerateRequest) -> float | None:
    return max(request.sampling.top_p, MIN_SENT_TOP_P) if request.sampling.top_p is not None else None


def _scalar(value: object, dtype: type) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def stop_words_list(token_ids: tuple[int, ...]) -> np.ndarray:
    """Single-token stop words in the backend's [1, 2, N] form: row 0 the ids, row 1 each word's end
    offset (1, 2, ..., N: one token per word)."""
    ids = np.asarray(token_ids, dtype=np.int32)
    offsets = np.arange(1, len(token_ids) + 1, dtype=np.int32)
    return np.stack([ids, offsets]).reshape(1, 2, -1)


def _not_carried_by_trtllm(request: GenerateRequest) -> EngineError | None:
    """Why the backend cannot carry this request as asked (module docstring), or None."""
    asked = request.sampling
    if asked.prompt_logprobs:
        return _refusal("logprobs", "with echo: its Triton backend returns no prompt log-probabilities")
    if asked.min_p and not asked.greedy:  # greedy takes the argmax: no cut applies (nor is sent)
        return _refusal("min_p", "its Triton backend has no min-p input")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(asked, name):
            return _refusal(
                name,
                "it counts the prompt's tokens as well as the output's (OpenAI counts only the output's), "
                "and its Triton backend in TensorRT-LLM 1.2.0 cannot be told to leave the prompt out",
            )
    if asked.n > 1 and not NUM_RETURN_SEQUENCES_CARRIED:
        return _refusal(
            "n > 1",
            "the Triton backend of TensorRT-LLM 1.2.0 hands num_return_sequences to the engine as "
            "no_repeat_ngram_size (NVIDIA/TensorRT-LLM#13633), so it would return one answer, not n",
        )
    if asked.logprobs:
        return _refusal(
            "top_logprobs (log-probability alternatives)",
            "it returns each generated token's own log-probability only, never the most likely "
            "alternatives; ask for logprobs without alternatives",
        )
    vocab = request.vocab_size
    if not asked.greedy and asked.top_k > TOP_K_MAX and (vocab is None or asked.top_k < vocab):
        return _refusal("top_k above 1024", "its sampler cuts at most the 1024 most likely tokens")
    if asked.guide is not None:
        if asked.guide.kind not in _GUIDE_TYPES:
            return _refusal(
                f"a {asked.guide.kind.value} guide",
                "its guided decoder (xgrammar) reads another grammar language than Sluice's (Lark)",
            )
        if asked.ignore_eos:
            return _refusal("ignore_eos with structured output", "a finished guide allows only the end")
    if asked.logit_bias and vocab is not None and asked.logit_bias[-1][0] >= vocab:
        return EngineError(EngineErrorKind.INVALID_REQUEST, f"logit_bias token ids must be in [0, {vocab})")
    return None


def _embedding_bias(request: GenerateRequest) -> np.ndarray:
    """logit_bias as the backend's dense ``embedding_bias`` [1, vocab_size] (the decoder checks the length
    against the model's vocabulary size: GptDecoderBatched / createNewDecoderRequests)."""
    if request.vocab_size is None:
        # NOTE: without the model's vocabulary size the dense vector cannot be built: a gateway bug.
        raise EngineError(
            EngineErrorKind.ENGINE_ERROR, "logit_bias on a tensorrt_llm replica needs the model's vocab_size"
        )
    bias = np.zeros((1, request.vocab_size), dtype=np.float32)
    ids, values = zip(*request.sampling.logit_bias, strict=True)
    bias[0, list(ids)] = values
    return bias


def _guide_tensors(guide: Guide) -> dict[str, np.ndarray]:
    text = _ANY_OBJECT if guide.kind is GuideKind.JSON else guide.text
    return {
        "guided_decoding_guide_type": np.array([[_GUIDE_TYPES[guide.kind].encode()]], dtype=np.object_),
        "guided_decoding_guide": np.array([[text.encode()]], dtype=np.object_),
    }


def trtllm_tensors(request: GenerateRequest) -> dict[str, np.ndarray]:
    """The tensorrt_llm model's tensors (the module docstring's table). Greedy is ``runtime_top_k`` 1;
    sampled sends the temperature, the top-k (0: none) and the top-p (1.0: none). What the backend cannot
    carry is refused as the caller's request, never dropped; controls at their "off" value are not sent."""
    if (refusal := _not_carried_by_trtllm(request)) is not None:
        raise refusal
    asked: Sampling = request.sampling
    out = {
        "input_ids": np.asarray(request.prompt_token_ids, dtype=np.int32).reshape(1, -1),
        "input_lengths": _scalar(len(request.prompt_token_ids), np.int32),
        "request_output_len": _scalar(asked.max_tokens, np.int32),
        "streaming": _scalar(True, np.bool_),
        "exclude_input_in_output": _scalar(True, np.bool_),
    }
    stop_ids = request.stop_token_ids
    if not asked.ignore_eos:
        if not request.eos_token_ids:
            # NOTE: without an end_id the model never stops before max_tokens: a gateway bug, said loudly.
            raise EngineError(
                EngineErrorKind.ENGINE_ERROR, "a tensorrt_llm replica needs the model's eos_token_ids"
            )
        out["end_id"] = _scalar(request.eos_token_ids[0], np.int32)
        out["pad_id"] = _scalar(request.eos_token_ids[0], np.int32)
        stop_ids = stop_ids + tuple(i for i in request.eos_token_ids[1:] if i not in stop_ids)
    if asked.greedy:
        out["runtime_top_k"] = _scalar(1, np.int32)
    else:
        out["temperature"] = _scalar(asked.temperature, np.float32)
        no_cut = request.vocab_size is not None and asked.top_k >= request.vocab_size
        out["runtime_top_k"] = _scalar(0 if no_cut else asked.top_k, np.int32)
        out["runtime_top_p"] = _scalar(_sent_top_p(request) or 1.0, np.float32)
    if asked.seed is not None:
        out["seed"] = _scalar(asked.seed, np.uint64)
    if stop_ids:
        out["stop_words_list"] = stop_words_list(stop_ids)
    if asked.repetition_penalty != 1.0:
        out["repetition_penalty"] = _scalar(asked.repetition_penalty, np.float32)
    if asked.logit_bias:
        out["embedding_bias"] = _embedding_bias(request)
    if asked.guide is not None:
        out |= _guide_tensors(asked.guide)
    if asked.logprobs is not None:
        out["return_log_probs"] = _scalar(True, np.bool_)
    if asked.n > 1:
        out["num_return_sequences"] = _scalar(asked.n, np.int32)
    return out


class TrtllmDecoder:
    """One request's tensorrt_llm responses as ``Delta``s. ``on_response`` for each response's outputs:
    the tokens of this response (``output_ids[0, 0, :sequence_length[0, 0]]``, one beam), of the answer
    ``sequence_index`` names (sent only when n > 1), with their log-probabilities when asked. The backend
    sends an answer's ``output_log_probs`` for all its tokens so far (LlmRequest::createResult), so this
    response's are the ones past what the answer already had. ``on_end`` once the stream ended after the
    response flagged final: each answer's final delta, with no tokens, its finish reason, and the prompt's
    length (the backend reports no prefix-cache hits per request: None)."""

    def __init__(self, request: GenerateRequest) -> None:
        self._max_tokens = request.sampling.max_tokens
        self._num_prompt_tokens = len(request.prompt_token_ids)
        self._logprobs = request.sampling.logprobs is not None
        self._num_generated = [0] * request.sampling.n  # per answer

    @property
    def num_generated_tokens(self) -> int:
        return sum(self._num_generated)

    def on_response(self, outputs: Mapping[str, np.ndarray | None]) -> Delta:
        output_ids, lengths = outputs.get("output_ids"), outputs.get("sequence_length")
        if output_ids is None or lengths is None:
            raise EngineError(EngineErrorKind.ENGINE_ERROR, "a tensorrt_llm response without output_ids")
        sequence = outputs.get("sequence_index")
        index = 0 if sequence is None else int(sequence.reshape(-1)[0])
        if not 0 <= index < len(self._num_generated):
            raise EngineError(EngineErrorKind.ENGINE_ERROR, f"a tensorrt_llm response of answer {index}")
        num_tokens = int(lengths.reshape(-1)[0])
        token_ids = [int(t) for t in output_ids.reshape(-1)[:num_tokens]]
        before = self._num_generated[index]
        self._num_generated[index] += len(token_ids)
        logprobs = self._token_logprobs(outputs.get("output_log_probs"), before, len(token_ids))
        return Delta(token_ids, index=index, logprobs=logprobs)

    def _token_logprobs(
        self, values: np.ndarray | None, before: int, num_tokens: int
    ) -> tuple[TokenLogprob, ...] | None:
        if not self._logprobs:
            return None
        if num_tokens == 0:
            return ()
        flat = np.asarray([] if values is None else values, dtype=np.float32).reshape(-1)
        if len(flat) >= before + num_tokens:  # all the answer's tokens so far (the backend's form)
            mine = flat[before : before + num_tokens]
        elif len(flat) >= num_tokens:  # this response's tokens first (the form of other releases)
            mine = flat[:num_tokens]
        else:
            raise EngineError(
                EngineErrorKind.ENGINE_ERROR,
                f"a tensorrt_llm response with {num_tokens} tokens and {len(flat)} output_log_probs",
            )
        return tuple(TokenLogprob(float(v)) for v in mine)

    def on_end(self) -> list[Delta]:
        return [
            Delta(
                [],
                FinishReason.LENGTH if generated >= self._max_tokens else FinishReason.STOP,
                self._num_prompt_tokens,
                None,
                index=index,
                logprobs=() if self._logprobs else None,
            )
            for index, generated in enumerate(self._num_generated)
        ]
