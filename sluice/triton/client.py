"""One generation over Triton's gRPC streaming API, with cancellation that actually reaches the model.

    async with GenerateStream(client, "sluice-tiny", request_tensors(ids, 64)) as stream:
        async for chunk in stream:
            ...

One gRPC stream per request: the client half-closes after its one request, and Triton ends the stream
once the model has sent the response flagged final, so the ``async for`` ends by itself. Leaving the
loop early does not end the call (seen here: the model noticed only when the client closed, seconds
later), so leaving the ``async with`` before the request finished cancels it explicitly; Triton then
reports the request cancelled and the model aborts it in the engine within a step.

A consumer that stops at the chunk carrying the finish reason has not seen the stream end yet: the
model's empty final response is still on its way. Cancelling then races that final send, and Triton
2.51 was seen to crash on it (SIGSEGV in tritonserver under load). So after a finished request the
exit waits, briefly, for the stream to end by itself, and cancels only if it does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import np_to_triton_dtype


@dataclass(frozen=True)
class TokenChunk:
    """The tokens one response carried; the totals only on the response with the request's last tokens."""

    token_ids: list[int]
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None


def to_infer_inputs(tensors: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def chunk_from_result(result: Any) -> TokenChunk:
    """Decode one ``InferResult`` of the model's outputs (see sluice.triton.converters)."""
    output_ids = result.as_numpy("output_ids")
    reason = result.as_numpy("finish_reason")
    if reason is None:
        return TokenChunk(output_ids.reshape(-1).tolist())
    return TokenChunk(
        token_ids=output_ids.reshape(-1).tolist(),
        finish_reason=reason.reshape(-1)[0].decode(),
        num_prompt_tokens=int(result.as_numpy("num_prompt_tokens").reshape(-1)[0]),
        num_cached_tokens=int(result.as_numpy("num_cached_tokens").reshape(-1)[0]),
    )


class GenerateStream:
    """An async context manager over one streamed request; iterate it for ``TokenChunk``s.

    Errors from the model (bad input, engine failure) are raised as ``InferenceServerException``.
    """

    def __init__(
        self,
        client: grpcclient.InferenceServerClient,
        model_name: str,
        tensors: Mapping[str, np.ndarray],
        request_id: str = "",
        timeout_s: float | None = None,
        drain_timeout_s: float = 2.0,
    ) -> None:
        self._client = client
        self._request = {
            "model_name": model_name,
            "inputs": to_infer_inputs(tensors),
            "request_id": request_id,
        }
        self._timeout_s = timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._call: Any = None
        self._finished = False  # a chunk with a finish reason was seen

    async def __aenter__(self) -> GenerateStream:
        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield self._request

        self._call = self._client.stream_infer(one_request(), stream_timeout=self._timeout_s)
        return self

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[TokenChunk]:
        if self._call is None:
            raise RuntimeError("use GenerateStream inside `async with`")
        async for result, error in self._call:
            if error is not None:
                raise error
            chunk = chunk_from_result(result)
            self._finished = self._finished or chunk.finish_reason is not None
            yield chunk

    def cancel(self) -> None:
        """Cancel the gRPC call (a no-op once the stream has ended)."""
        if self._call is not None:
            self._call.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # A consumer that closes its generator right after the finishing chunk exits with GeneratorExit:
        # the request is still finished, so it drains too. Errors and cancellations cancel at once.
        quiet_exit = exc_type is None or issubclass(exc_type, GeneratorExit)
        if self._finished and quiet_exit and await self._ended_by_itself():
            return
        self.cancel()

    async def _ended_by_itself(self) -> bool:
        """Wait up to drain_timeout_s for the stream's end (the model's final response)."""

        async def drain() -> None:
            async for _ in self._call:
                pass

        try:
            await asyncio.wait_for(drain(), self._drain_timeout_s)
        except Exception:  # timed out, or the stream failed after finishing: cancel it then
            return False
        return True
