"""One generation over Triton's gRPC streaming API, with cancellation that actually reaches the model:
the client's side of the tensor contract in ``sluice.wire``.

    async with GenerateStream(client, "sluice-tiny", request_tensors(ids, 64)) as stream:
        async for chunk in stream:
            ...

One gRPC stream per request: the client half-closes after its one request, and Triton ends the stream
once the model has sent the response flagged final, so the ``async for`` ends by itself. The call is
Triton's ``ModelStreamInfer`` made as a unary-stream call on the client's channel (``open_stream``): the
request, built straight into its protobuf (``infer_request``, the bytes tritonclient's would have), goes
out with the half-close in one batch, where tritonclient's ``stream_infer`` starts a task to consume an
async iterator of request dicts and then writes and half-closes in two more round trips through gRPC's
completion queue: a fifth less client CPU per stream (docs/benchmarks.md, "starting a stream"). On the
wire the two are the same: HTTP/2 has no call types, only messages and a half-close. Leaving the
loop early does not end the call (seen here: the model noticed only when the client closed, seconds
later), so leaving the ``async with`` before the request finished cancels it explicitly; Triton then
reports the request cancelled and the model aborts it in the engine within a step.

A consumer that stops at the chunk carrying the finish reason has not seen the stream end yet: the
stream's end (after an empty final response, from a model that sends its final flag alone) is still on
its way. Cancelling then races that final send, and Triton 2.51 was seen to crash on it (SIGSEGV in
tritonserver under load). So after a finished request the exit waits, briefly, for the stream to end by
itself, and cancels only if it does not.

Decoding: each response of the stream is read straight from its ``ModelStreamInferResponse`` protobuf
(``chunk_from_response``: the raw little-endian contents Triton sends, without an ``InferResult`` or a
numpy array per response); a response in any other form (contents not raw, an unexpected datatype or a
missing output) goes through ``chunk_from_result`` as before, so both give the same chunk or error.

Errors: a response that carries ``error_kind`` (the CPU engine's model sends one for a request it
refused or failed) is raised as ``EngineError`` of that kind. Everything else that goes wrong (Triton's
own errors, another backend's errors, transport failures) is raised as tritonclient and gRPC raise it;
``sluice.engine_client.triton`` classifies those by gRPC status.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from types import TracebackType
from typing import Any, cast

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, serialize_byte_tensor

from sluice.wire import EngineError, EngineErrorKind, Guide, TokenLogprob


def grpc_target(endpoint: str) -> str:
    """host:port from an endpoint that may carry a grpc:// or http:// scheme."""
    for scheme in ("grpc://", "http://"):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme) :]
    return endpoint


def check_client(endpoint: str) -> grpcclient.InferenceServerClient:
    """A client for one health check (verification, probe): the caller closes it.
    NOTE: a subchannel pool of its own: gRPC otherwise shares one reconnect backoff between channels to an
    address, so the first checks after a replica comes up could fail without trying."""
    return grpcclient.InferenceServerClient(
        grpc_target(endpoint), channel_args=[("grpc.use_local_subchannel_pool", 1)]
    )


@dataclass(frozen=True)
class TokenChunk:
    """The tokens one response carried for answer ``index``; the totals only on the response with that
    answer's last tokens; their log-probabilities when the request asked for them."""

    token_ids: list[int]
    finish_reason: str | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    index: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None


def request_tensors(
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    *,
    streaming: bool = True,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    end_id: int | None = None,
    stop_token_ids: Sequence[int] = (),
    priority: int | None = None,
    cache_scope: str,
    ignore_eos: bool | None = None,
    min_p: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    repetition_penalty: float | None = None,
    logit_bias: Sequence[tuple[int, float]] = (),
    guide: Guide | None = None,
    logprobs: int | None = None,
    n: int = 1,
    prompt_logprobs: bool = False,
) -> dict[str, np.ndarray]:
    """A request's input tensors (``sluice.wire``), each with its batch dimension of 1.

    ``cache_scope`` (the tenant) is always sent; other arguments left as None are not, so the model's
    defaults apply. Values are not checked here: the model refuses what it cannot serve.
    """
    out = {
        "input_ids": np.asarray(prompt_token_ids, dtype=np.int32).reshape(1, -1),
        "input_lengths": np.array([[len(prompt_token_ids)]], dtype=np.int32),
        "request_output_len": np.array([[max_tokens]], dtype=np.int32),
        "streaming": np.array([[streaming]], dtype=np.bool_),
    }
    scalars: dict[str, tuple[object, type]] = {
        "temperature": (temperature, np.float32),
        "runtime_top_k": (top_k, np.int32),
        "runtime_top_p": (top_p, np.float32),
        "random_seed": (seed, np.uint64),
        "end_id": (end_id, np.int32),
        "priority": (priority, np.int32),
        "ignore_eos": (ignore_eos, np.bool_),
        "min_p": (min_p, np.float32),
        "presence_penalty": (presence_penalty, np.float32),
        "frequency_penalty": (frequency_penalty, np.float32),
        "repetition_penalty": (repetition_penalty, np.float32),
    }
    for name, (value, dtype) in scalars.items():
        if value is not None:
            out[name] = np.array([[value]], dtype=dtype)
    if stop_token_ids:
        out["stop_token_ids"] = np.asarray(stop_token_ids, dtype=np.int32).reshape(1, -1)
    if logit_bias:
        ids, values = zip(*logit_bias, strict=True)
        out["logit_bias_ids"] = np.asarray(ids, dtype=np.int32).reshape(1, -1)
        out["logit_bias_values"] = np.asarray(values, dtype=np.float32).reshape(1, -1)
    if logprobs is not None:
        out["return_log_probs"] = np.array([[True]], dtype=np.bool_)
        if logprobs:
            out["top_logprobs"] = np.array([[logprobs]], dtype=np.int32)
        if prompt_logprobs:
            out["return_prompt_log_probs"] = np.array([[True]], dtype=np.bool_)
    if n != 1:
        out["num_return_sequences"] = np.array([[n]], dtype=np.int32)
    if guide is not None:
        out["guided_decoding_guide_type"] = np.array([[guide.kind.value.encode()]], dtype=np.object_)
        if guide.text:
            out["guided_decoding_guide"] = np.array([[guide.text.encode()]], dtype=np.object_)
    out["cache_scope"] = np.array([[cache_scope.encode()]], dtype=np.object_)
    return out


def to_infer_inputs(tensors: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def infer_request(
    model_name: str, tensors: Mapping[str, np.ndarray], request_id: str = ""
) -> service_pb2.ModelInferRequest:
    """The ``ModelInferRequest`` of ``tensors``, built directly: what tritonclient builds from
    ``to_infer_inputs(tensors)`` (its ``_get_inference_request``), without an ``InferInput`` per tensor."""
    request = service_pb2.ModelInferRequest(model_name=model_name, id=request_id)
    for name, array in tensors.items():
        datatype = np_to_triton_dtype(array.dtype)
        request.inputs.add(name=name, datatype=datatype, shape=array.shape)
        if datatype == "BYTES":  # each element as its 4-byte little-endian length, then its bytes
            serialized = serialize_byte_tensor(array)
            request.raw_input_contents.append(serialized.item() if serialized.size > 0 else b"")
        else:
            request.raw_input_contents.append(array.tobytes())
    return request


MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"


def open_stream(
    client: grpcclient.InferenceServerClient, request: service_pb2.ModelInferRequest, timeout_s: float | None
) -> Any:
    """Start ``request`` as Triton's ``ModelStreamInfer``, made as a unary-stream call (the module's
    docstring says why): an async iterator of ``ModelStreamInferResponse`` protobufs with ``cancel()``.
    NOTE: tritonclient's aio client keeps its channel as ``_channel`` and offers no other way to it."""
    channel: grpc.aio.Channel = client._channel
    method = channel.unary_stream(
        MODEL_STREAM_INFER,
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )
    return method(request, timeout=timeout_s)


def chunk_from_result(result: Any) -> TokenChunk:
    """Decode one ``InferResult`` of the model's outputs (``sluice.wire``). Raises
    ``EngineError`` for a response that carries ``error_kind``."""
    error_kind = result.as_numpy("error_kind")
    if error_kind is not None:
        raise _replica_error(error_kind, result.as_numpy("error_message"))
    output_ids = result.as_numpy("output_ids")
    reason = result.as_numpy("finish_reason")
    index = result.as_numpy("sequence_index")
    answer = int(index.reshape(-1)[0]) if index is not None else 0
    logprobs = _logprobs_of(result)
    prompt = _logprobs_of(result, "prompt_log_probs", "prompt_top_logprob_ids", "prompt_top_logprobs")
    if reason is None:
        return TokenChunk(
            output_ids.reshape(-1).tolist(), index=answer, logprobs=logprobs, prompt_logprobs=prompt
        )
    return TokenChunk(
        token_ids=output_ids.reshape(-1).tolist(),
        finish_reason=reason.reshape(-1)[0].decode(),
        num_prompt_tokens=int(result.as_numpy("num_prompt_tokens").reshape(-1)[0]),
        num_cached_tokens=int(result.as_numpy("num_cached_tokens").reshape(-1)[0]),
        index=answer,
        logprobs=logprobs,
        prompt_logprobs=prompt,
    )


def _logprobs_of(
    result: Any,
    name: str = "output_log_probs",
    ids_name: str = "top_logprob_ids",
    top_name: str = "top_logprobs",
) -> tuple[TokenLogprob, ...] | None:
    """``output_log_probs`` (and the alternatives, when sent) as one ``TokenLogprob`` per token (or the
    prompt's, by their names)."""
    values = result.as_numpy(name)
    if values is None:
        return None
    top_ids, top_values = result.as_numpy(ids_name), result.as_numpy(top_name)
    chosen = values.reshape(-1).tolist()
    if top_ids is None or top_values is None:
        return tuple(TokenLogprob(v) for v in chosen)
    k = top_ids.shape[-1]
    ids, alts = top_ids.reshape(-1, k).tolist(), top_values.reshape(-1, k).tolist()
    return tuple(
        TokenLogprob(v, tuple(zip(i, a, strict=True))) for v, i, a in zip(chosen, ids, alts, strict=True)
    )


# The outputs the fast decoder reads, and the datatype each must have for it (else: chunk_from_result).
_FAST_DATATYPES = {
    "output_ids": "INT32",
    "finish_reason": "BYTES",
    "num_prompt_tokens": "INT32",
    "num_cached_tokens": "INT32",
    "error_kind": "BYTES",
    "error_message": "BYTES",
}


# Outputs only requests that asked for more carry (logprobs, n > 1): decoded by ``chunk_from_result``.
_DETAIL_OUTPUTS = frozenset(
    {"output_log_probs", "top_logprob_ids", "top_logprobs", "sequence_index", "prompt_log_probs"}
)


def chunk_from_response(response: Any) -> TokenChunk:
    """Decode one ``ModelStreamInferResponse`` of the model's stream: what ``chunk_from_result`` gives for
    ``InferResult(response.infer_response)``, read from the protobuf's raw contents directly. Raises
    ``InferenceServerException`` for a response carrying Triton's ``error_message`` (as tritonclient's
    stream does), ``EngineError`` for one carrying ``error_kind``."""
    if response.error_message:
        raise InferenceServerException(msg=response.error_message)
    infer = response.infer_response
    outputs, contents = infer.outputs, infer.raw_output_contents
    if len(outputs) == len(contents):
        found: dict[str, bytes] = {}
        for output, data in zip(outputs, contents, strict=True):
            name = output.name
            datatype = _FAST_DATATYPES.get(name)
            if name in _DETAIL_OUTPUTS:  # log-probabilities, an answer's index: the generic decoder's
                break
            if datatype is None or name in found:  # not read (sequence_length), or a repeat: the first counts
                continue
            if output.datatype != datatype:
                break
            # Exactly the elements the shape says (else the generic decoder's reshape decides): INT32, 4
            # bytes each; BYTES, read here only as one element (a 4-byte length, then that many bytes).
            if datatype == "INT32":
                if len(data) != 4 * prod(output.shape):
                    break
            elif (
                prod(output.shape) != 1
                or len(data) < 4
                or 4 + int.from_bytes(data[:4], "little") != len(data)
            ):
                break
            found[name] = data
        else:
            chunk = _fast_chunk(found)
            if chunk is not None:
                return chunk
    return chunk_from_result(InferResult(infer))


def _fast_chunk(found: dict[str, bytes]) -> TokenChunk | None:
    """The chunk of a response's raw contents by output name; None for a form left to ``chunk_from_result``
    (an error, a missing or empty output)."""
    ids = found.get("output_ids")
    if ids is None or "error_kind" in found:
        return None
    token_ids = memoryview(ids).cast("i").tolist()
    reason = found.get("finish_reason")
    if reason is None:
        return TokenChunk(token_ids)
    num_prompt, num_cached = found.get("num_prompt_tokens"), found.get("num_cached_tokens")
    if not num_prompt or not num_cached:
        return None
    return TokenChunk(
        token_ids=token_ids,
        finish_reason=reason[4:].decode(),
        num_prompt_tokens=int.from_bytes(num_prompt[:4], "little", signed=True),
        num_cached_tokens=int.from_bytes(num_cached[:4], "little", signed=True),
    )


def _replica_error(kind_tensor: np.ndarray, message_tensor: np.ndarray | None) -> EngineError:
    text = _text(kind_tensor)
    message = "" if message_tensor is None else _text(message_tensor)
    try:
        kind = EngineErrorKind(text)
    except ValueError:  # NOTE: a replica newer or other than this client: its failure, said as such
        return EngineError(
            EngineErrorKind.ENGINE_ERROR, f"unknown error kind {text!r} from the replica: {message}"
        )
    return EngineError(kind, message)


def _text(tensor: np.ndarray) -> str:
    value = tensor.reshape(-1)[0]
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class GenerateStream:
    """An async context manager over one streamed request; iterate it for ``TokenChunk``s.

    A request the model refused or failed raises ``EngineError`` of the kind it sent; Triton's own errors
    are raised as ``InferenceServerException`` (transport failures as ``grpc.RpcError``).
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
        self._request = infer_request(model_name, tensors, request_id)
        self._timeout_s = timeout_s
        self._drain_timeout_s = drain_timeout_s
        self._call: Any = None
        self._finished = False  # a chunk with a finish reason was seen

    async def __aenter__(self) -> GenerateStream:
        self._call = open_stream(self._client, self._request, self._timeout_s)
        return self

    def __aiter__(self) -> AsyncIterator[TokenChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[TokenChunk]:
        async for response in self.responses():
            chunk = chunk_from_response(response)
            self._finished = self._finished or chunk.finish_reason is not None
            yield chunk

    def responses(self) -> AsyncIterator[Any]:
        """The call's ``ModelStreamInferResponse`` protobufs, for a caller that decodes them itself
        (``chunk_from_response``) and reports a finishing chunk with ``finished``."""
        if self._call is None:
            raise RuntimeError("use GenerateStream inside `async with`")
        return cast(AsyncIterator[Any], self._call)

    def finished(self) -> None:
        """A chunk with a finish reason was read (by a caller iterating ``responses``)."""
        self._finished = True

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
