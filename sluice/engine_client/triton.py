"""``EngineClient`` over Triton's gRPC streaming API (``tritonclient.grpc.aio``): production's path.

One client for every Triton model a replica may serve: ``dialect`` (``sluice.engine_client.dialects``)
says which tensors to send and how to read the responses; the gateway picks it from the registry
version's build target. One gRPC stream per request. Leaving the ``async for`` over the call does not
end it, so closing the generator cancels the call explicitly (``GenerateStream.__aexit__``); Triton
marks the request cancelled and the model aborts it in the engine within a step.

How a failure becomes an ``EngineErrorKind``, one rule for every backend behind Triton:
- A response carrying the ``error_kind`` output (the CPU engine's model refusing or failing a request)
  is that kind, with its ``error_message``.
- Any other error (Triton's own, another backend's such as TensorRT-LLM's, the transport's) is
  classified by its gRPC status alone, never by its text: UNAVAILABLE and DEADLINE_EXCEEDED are
  ``UNAVAILABLE``, INVALID_ARGUMENT is ``INVALID_REQUEST``, anything else, including an error without
  a status (Triton reports an error response inside a stream as text only), is ``ENGINE_ERROR``: the
  gateway built the tensors, so what the replica refuses without saying why is not the caller's fault.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

import grpc
import httpx
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferResult
from tritonclient.utils import InferenceServerException

from sluice.engine_client.base import Delta, EngineClient, GenerateRequest, ReplicaStats
from sluice.engine_client.dialects import Dialect, build_tensors
from sluice.engine_client.trtllm_dialect import TRTLLM_OUTPUTS, TrtllmDecoder
from sluice.triton.client import GenerateStream, TokenChunk, chunk_from_response, grpc_target
from sluice.triton.metrics import replica_stats_from_metrics
from sluice.wire import EngineError, EngineErrorKind, FinishReason

log = logging.getLogger(__name__)


class TritonEngineClient(EngineClient):
    kind = "triton"

    def __init__(
        self,
        grpc_url: str,
        model_name: str,
        stream_timeout_s: float | None = None,
        *,
        metrics_url: str | None = None,
        dialect: Dialect = Dialect.CPU_ENGINE,
    ) -> None:
        self.replica = grpc_target(grpc_url)
        self.dialect = dialect
        self._model_name = model_name
        self._stream_timeout_s = stream_timeout_s
        self._metrics_url = metrics_url
        self._client: grpcclient.InferenceServerClient | None = None
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        if self._client is None:
            self._client = grpcclient.InferenceServerClient(self.replica)
            try:  # the served version, for telemetry and the ledger; the replica may not be up yet
                metadata = await self._client.get_model_metadata(self._model_name, as_json=True)
                self.model_version = str((metadata.get("versions") or [self.model_version])[-1])
            except InferenceServerException as exc:
                log.warning("model version of %s unknown at start: %s", self._model_name, exc.message())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def ready(self) -> bool:
        try:
            return self._client is not None and bool(await self._client.is_server_ready())
        except InferenceServerException:
            return False

    async def model_loaded(self, model: str) -> bool:
        try:
            return self._client is not None and bool(await self._client.is_model_ready(model))
        except InferenceServerException:
            return False

    async def replica_stats(self) -> ReplicaStats | None:
        """From the replica's metrics endpoint (Triton's, on its metrics port)."""
        if self._metrics_url is None:
            return None
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=0.5)
        try:
            response = await self._http.get(self._metrics_url)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            log.debug("replica metrics unreadable: %s", exc)
            return None
        return replica_stats_from_metrics(response.text, self._model_name)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        if self._client is None:
            raise EngineError(EngineErrorKind.UNAVAILABLE, "the Triton client is not started")
        tensors = build_tensors(self.dialect, request)
        stream_class = _ResultStream if self.dialect is Dialect.TENSORRT_LLM else GenerateStream
        stream = stream_class(
            self._client, self._model_name, tensors, request.request_id, self._stream_timeout_s
        )
        # NOTE: the `async with` cancels the gRPC call on every way out, including this generator's
        # aclose() when the consumer stops early; a call that already ended ignores the cancel.
        async with stream:
            try:
                if isinstance(stream, _ResultStream):
                    # NOTE: the model sends no finish reason; Triton ends the stream after the response it
                    # flagged final, so the stream's end is when the decoder gives the final delta.
                    decoder = TrtllmDecoder(request)
                    async with aclosing(stream.outputs(TRTLLM_OUTPUTS)) as responses:
                        async for outputs in responses:
                            delta = decoder.on_response(outputs)
                            if delta.token_ids:
                                yield delta
                    for final in decoder.on_end():  # each answer's final delta
                        yield final
                    return
                num_open = request.sampling.n  # answers not finished yet; the stream ends with the last
                # NOTE: the call's protobufs decoded here rather than through the stream's iterator: one
                # async generator fewer between the gRPC call and the gateway, per response.
                async for response in stream.responses():
                    chunk = chunk_from_response(response)
                    if chunk.finish_reason is None:
                        yield Delta(
                            chunk.token_ids,
                            index=chunk.index,
                            logprobs=chunk.logprobs,
                            prompt_logprobs=chunk.prompt_logprobs,
                        )
                        continue
                    reason = FinishReason(chunk.finish_reason) if chunk.finish_reason else None
                    num_open -= reason is not None
                    if num_open == 0:
                        stream.finished()
                    yield _delta(chunk, reason)
                    if num_open == 0:
                        return
            except InferenceServerException as exc:  # EngineError from the model's own response passes
                raise _engine_error(exc) from None
            except grpc.RpcError as exc:  # the aio stream raises gRPC's own errors for transport failures
                raise _rpc_error(exc) from None
        raise EngineError(EngineErrorKind.ENGINE_ERROR, "the replica ended the stream without finishing")


def _delta(chunk: TokenChunk, reason: FinishReason | None) -> Delta:
    return Delta(
        chunk.token_ids,
        reason,
        chunk.num_prompt_tokens,
        chunk.num_cached_tokens,
        chunk.index,
        chunk.logprobs,
        chunk.prompt_logprobs,
    )


class _ResultStream(GenerateStream):
    """A stream whose responses are read as the model's raw output tensors (a dialect decodes them)."""

    async def outputs(self, names: tuple[str, ...]) -> AsyncGenerator[dict[str, np.ndarray | None], None]:
        async for response in self.responses():
            if response.error_message:  # Triton's (or the backend's) error for the request, as text
                raise InferenceServerException(msg=response.error_message)
            result = InferResult(response.infer_response)
            yield {name: result.as_numpy(name) for name in names}


# The gRPC statuses that say whose fault it is; every other status, and none, is ENGINE_ERROR.
_KIND_BY_STATUS = {
    "UNAVAILABLE": EngineErrorKind.UNAVAILABLE,
    "DEADLINE_EXCEEDED": EngineErrorKind.UNAVAILABLE,
    "INVALID_ARGUMENT": EngineErrorKind.INVALID_REQUEST,
}


def kind_from_status(status: str | None) -> EngineErrorKind:
    """The kind of an error without the model's ``error_kind`` (the module's rule). ``status`` as gRPC or
    tritonclient spell it ("UNAVAILABLE", "StatusCode.UNAVAILABLE"); None: the error came without one."""
    name = (status or "").rsplit(".", 1)[-1].upper()
    return _KIND_BY_STATUS.get(name, EngineErrorKind.ENGINE_ERROR)


def _engine_error(exc: InferenceServerException) -> EngineError:
    # NOTE: tritonclient leaves the status None for an error response inside a stream.
    return EngineError(kind_from_status(exc.status()), exc.message() or str(exc))


def _rpc_error(exc: grpc.RpcError) -> EngineError:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return EngineError(kind_from_status(code.name if code is not None else None), f"{code}: {details}")
