"""A FAKE of TensorRT-LLM's ``tensorrt_llm`` Triton model, for tests only (no GPU, no TensorRT-LLM here).

Served by Triton's Python backend under the ``tensorrt_llm`` config.pbtxt that build_engines renders (its
backend swapped to python), so Triton itself checks every request's inputs (names, data types, shapes)
against the real declaration before this model sees them. It answers as the backend does
(model_instance_state.cc fillTritonResponse): one response per generated token (``output_ids`` [1, 1, T],
``sequence_length`` [1, 1]), the last flagged final, no finish reason. It "generates" token
``(previous * 7 + 3 + answer) % 50`` from the prompt's last token, stopping at ``end_id`` (not emitted: the
answer's last response then has no tokens), at a stop word (emitted), or at ``request_output_len``.

What the gateway sends since issue 25, honoured as the backend does:
- ``return_log_probs``: every response carries ``output_log_probs`` [1, 1, L] with the log-probabilities
  of ALL the answer's tokens so far (LlmRequest::createResult), token t's being ``-(t + 1) / 100``;
- ``num_return_sequences`` n: n answers stepped in turn, each response with ``sequence_index`` [1, 1] (only
  when n > 1), the final flag on the response that ends the last answer;
- ``embedding_bias``: refused unless exactly ``VOCAB`` long (the decoder's vocabulary-size check), and a
  token whose bias is -100 or less is never produced (the next one in the sequence is taken instead);
- ``guided_decoding_guide_type``: refused unless one the backend maps (stricter than the backend, which
  would silently drop it); ``repetition_penalty``, ``runtime_top_k``, ``temperature``... accepted, unused.

Like the backend, it stops a request whose client cancelled it. With ``FAKE_TRTLLM_TOKEN_DELAY_S`` in the
server's environment it waits that long before each token (a stream long enough to be cancelled mid-way;
default 0).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

VOCAB = 50
GUIDE_TYPES = {"json", "json_schema", "regex", "ebnf_grammar"}  # utils.cc getGuidedDecodingParamsFromTensors


def _input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request: Any, name: str, default: Any) -> Any:
    value = _input(request, name)
    return default if value is None else value.reshape(-1)[0].item()


def _logprob(token: int) -> float:
    return -(token + 1) / 100


class _Answer:
    def __init__(self, index: int, last_prompt_token: int, banned: set[int]) -> None:
        self.index = index
        self.token = last_prompt_token
        self.banned = banned
        self.tokens: list[int] = []
        self.done = False

    def next_token(self) -> int:
        for _ in range(VOCAB):
            self.token = (self.token * 7 + 3 + self.index) % VOCAB
            if self.token not in self.banned:
                break
        return self.token


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.token_delay_s = float(os.environ.get("FAKE_TRTLLM_TOKEN_DELAY_S", "0"))

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._generate(request, sender)
            except ValueError as exc:  # the backend's errors reach the client as an error response
                sender.send(
                    pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(exc))),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        return None

    def _generate(self, request: Any, sender: Any) -> None:
        prompt = _input(request, "input_ids")
        max_tokens = int(_scalar(request, "request_output_len", 0))
        end = _input(request, "end_id")
        end_id = None if end is None else int(end.reshape(-1)[0])
        words = _input(request, "stop_words_list")
        stop_ids = set() if words is None else {int(t) for t in words.reshape(2, -1)[0]}
        num_answers = int(_scalar(request, "num_return_sequences", 1))
        logprobs = bool(_scalar(request, "return_log_probs", False))
        bias = _input(request, "embedding_bias")
        if bias is not None and bias.size != VOCAB:
            raise ValueError(f"The embedding bias shape is not as expected: {bias.size}, vocab size {VOCAB}")
        banned = set() if bias is None else {int(i) for i in np.flatnonzero(bias.reshape(-1) <= -100)}
        guide_type = _input(request, "guided_decoding_guide_type")
        if guide_type is not None and guide_type.reshape(-1)[0].decode() not in GUIDE_TYPES:
            raise ValueError(f"unknown guide type {guide_type.reshape(-1)[0]!r}")
        last = int(prompt.reshape(-1)[-1])  # type: ignore[union-attr]
        answers = [_Answer(i, last, banned) for i in range(num_answers)]
        for _step in range(max_tokens):
            for answer in (a for a in answers if not a.done):
                if self.token_delay_s:
                    time.sleep(self.token_delay_s)
                if sender.is_cancelled():
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
                token = answer.next_token()
                if token != end_id:
                    answer.tokens.append(token)
                answer.done = token == end_id or token in stop_ids or len(answer.tokens) == max_tokens
                emitted = [] if token == end_id else [token]
                final = all(a.done for a in answers)
                sender.send(
                    self._response(answer, emitted, logprobs, num_answers),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0,
                )
                if final:
                    return

    @staticmethod
    def _response(answer: _Answer, token_ids: list[int], logprobs: bool, num_answers: int) -> Any:
        tensors = [
            pb_utils.Tensor("output_ids", np.asarray(token_ids, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(token_ids)]], dtype=np.int32)),
        ]
        if logprobs:  # all the answer's tokens so far, as LlmRequest::createResult sends them
            values = np.asarray([_logprob(t) for t in answer.tokens], dtype=np.float32).reshape(1, 1, -1)
            tensors.append(pb_utils.Tensor("output_log_probs", values))
        if num_answers > 1:
            tensors.append(pb_utils.Tensor("sequence_index", np.array([[answer.index]], dtype=np.int32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)
