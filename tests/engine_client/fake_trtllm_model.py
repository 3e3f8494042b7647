"""A FAKE of TensorRT-LLM's ``tensorrt_llm`` Triton model, for tests only (no GPU, no TensorRT-LLM here).

Served by Triton's Python backend under the ``tensorrt_llm`` config.pbtxt that build_engines renders (its
backend swapped to python), so Triton itself checks every request's inputs (names, data types, shapes)
against the real declaration before this model sees them. It answers as the backend does: one response
per generated token (``output_ids`` [1, 1, T], ``sequence_length`` [1, 1]), the last flagged final, no
finish reason. It "generates" token ``(previous * 7 + 3) % 50`` from the prompt's last token, stopping at
``end_id`` (not emitted: the last response then has no tokens), at a stop word (emitted), or at
``request_output_len``. Like the backend, it stops a request whose client cancelled it. With
``FAKE_TRTLLM_TOKEN_DELAY_S`` in the server's environment it waits that long before each token (a stream
long enough to be cancelled mid-way; default 0).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _response(token_ids: list[int]) -> Any:
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("output_ids", np.asarray(token_ids, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.array([[len(token_ids)]], dtype=np.int32)),
        ]
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        self.token_delay_s = float(os.environ.get("FAKE_TRTLLM_TOKEN_DELAY_S", "0"))

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            prompt = _input(request, "input_ids")
            max_tokens = int(_input(request, "request_output_len").reshape(-1)[0])  # type: ignore[union-attr]
            end = _input(request, "end_id")
            end_id = None if end is None else int(end.reshape(-1)[0])
            words = _input(request, "stop_words_list")
            stop_ids = set() if words is None else {int(t) for t in words.reshape(2, -1)[0]}
            token = int(prompt.reshape(-1)[-1])  # type: ignore[union-attr]
            for step in range(max_tokens):
                if self.token_delay_s:
                    time.sleep(self.token_delay_s)
                if sender.is_cancelled():
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                token = (token * 7 + 3) % 50
                if token == end_id:
                    sender.send(_response([]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    break
                final = step == max_tokens - 1 or token in stop_ids
                sender.send(
                    _response([token]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
                )
                if final:
                    break
        return None
