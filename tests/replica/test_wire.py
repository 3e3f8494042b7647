"""The client's side of the wire (sluice.wire), without a server: a replica's error kind is
read from its field, never from its text; an error without the field is classified by gRPC status only.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import _utils as tritonclient_utils
from tritonclient.grpc import service_pb2

from sluice.engine_client import EngineError, EngineErrorKind, EnginePriority, GenerateRequest, Sampling
from sluice.engine_client.triton import kind_from_status
from sluice.triton.client import (
    GenerateStream,
    chunk_from_result,
    infer_request,
    request_tensors,
    to_infer_inputs,
)
from sluice.wire import Guide, GuideKind


class FakeResult:
    """An ``InferResult`` (named as one): ``as_numpy`` of an output the response lacks is None."""

    def __init__(self, **outputs: Any) -> None:
        self.outputs = {
            k: np.array([[v]], dtype=np.object_ if isinstance(v, bytes) else np.int32)
            for k, v in outputs.items()
        }

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self.outputs.get(name)


def tokens(*ids: int) -> FakeResult:
    result = FakeResult()
    result.outputs["output_ids"] = np.array([[list(ids)]], dtype=np.int32)
    return result


@pytest.mark.parametrize("kind", [EngineErrorKind.INVALID_REQUEST, EngineErrorKind.ENGINE_ERROR])
def test_a_response_with_an_error_kind_raises_that_kind(kind: EngineErrorKind) -> None:
    # NOTE: the message says "engine ..." for both: the text must not decide the kind.
    result = FakeResult(error_kind=kind.value.encode(), error_message=b"engine refused: input_ids[1]")
    with pytest.raises(EngineError) as err:
        chunk_from_result(result)
    assert err.value.kind is kind and err.value.message == "engine refused: input_ids[1]"


def test_an_unknown_error_kind_is_the_replicas_failure_and_says_so() -> None:
    with pytest.raises(EngineError) as err:
        chunk_from_result(FakeResult(error_kind=b"overloaded", error_message=b"busy"))
    assert err.value.kind is EngineErrorKind.ENGINE_ERROR
    assert err.value.message == "unknown error kind 'overloaded' from the replica: busy"


def test_token_responses_decode_as_before() -> None:
    assert chunk_from_result(tokens(5, 6)).token_ids == [5, 6]
    final = tokens(7)
    final.outputs |= FakeResult(finish_reason=b"stop", num_prompt_tokens=3, num_cached_tokens=0).outputs
    chunk = chunk_from_result(final)
    assert (chunk.finish_reason, chunk.num_prompt_tokens, chunk.num_cached_tokens) == ("stop", 3, 0)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("StatusCode.UNAVAILABLE", EngineErrorKind.UNAVAILABLE),  # tritonclient's spelling
        ("DEADLINE_EXCEEDED", EngineErrorKind.UNAVAILABLE),  # grpc.StatusCode.name
        ("StatusCode.INVALID_ARGUMENT", EngineErrorKind.INVALID_REQUEST),
        ("StatusCode.INTERNAL", EngineErrorKind.ENGINE_ERROR),
        ("StatusCode.CANCELLED", EngineErrorKind.ENGINE_ERROR),
        (None, EngineErrorKind.ENGINE_ERROR),  # an error response inside a stream: text only
    ],
)
def test_an_error_without_the_field_is_classified_by_status_only(
    status: str | None, kind: EngineErrorKind
) -> None:
    assert kind_from_status(status) is kind


class OneResponseCall:
    """gRPC's aio call (named as one), yielding one response and ending."""

    def __init__(self, response: Any) -> None:
        self.responses = [response]

    def __aiter__(self) -> OneResponseCall:
        return self

    async def __anext__(self) -> Any:
        if not self.responses:
            raise StopAsyncIteration
        return self.responses.pop()

    def cancel(self) -> bool:
        return True


class FakeClient:
    """tritonclient's aio client (named as one): its channel's unary-stream method starts the call."""

    def __init__(self, call: OneResponseCall) -> None:
        self._channel = SimpleNamespace(unary_stream=lambda method, **_: lambda request, timeout=None: call)


def error_response(kind: bytes, message: bytes) -> Any:
    """A ``ModelStreamInferResponse`` carrying the model's ``error_kind`` and ``error_message`` (BYTES)."""
    infer = service_pb2.ModelInferResponse(model_name="m", model_version="1")
    for name, value in (("error_kind", kind), ("error_message", message)):
        infer.outputs.add(name=name, datatype="BYTES", shape=[1, 1])
        infer.raw_output_contents.append(len(value).to_bytes(4, "little") + value)
    return service_pb2.ModelStreamInferResponse(infer_response=infer)


def test_the_stream_raises_the_replicas_error_kind() -> None:
    refusal = error_response(b"invalid_request", b"max_tokens must be at least 1")
    tensors = request_tensors([1, 2], 0, cache_scope="acme")

    async def run() -> None:
        async with GenerateStream(FakeClient(OneResponseCall(refusal)), "m", tensors) as stream:  # type: ignore[arg-type]
            async for _ in stream:
                pass

    with pytest.raises(EngineError) as err:
        asyncio.run(run())
    assert err.value.kind is EngineErrorKind.INVALID_REQUEST


def test_a_request_carries_its_priority_as_the_wire_enum() -> None:
    assert (
        GenerateRequest("r", [1], Sampling(4), priority=EnginePriority.BATCH, cache_scope="a").priority == 2
    )
    coerced = GenerateRequest("r", [1], Sampling(4), priority=1, cache_scope="a")  # type: ignore[arg-type]
    assert coerced.priority is EnginePriority.OVER_SHARE
    assert GenerateRequest("r", [1], Sampling(4), cache_scope="a").priority is EnginePriority.UNDER_SHARE
    with pytest.raises(ValueError, match="priority must be one of 0, 1, 2, got 3"):
        GenerateRequest("r", [1], Sampling(4), priority=3, cache_scope="a")  # type: ignore[arg-type]


def test_a_request_is_the_protobuf_tritonclient_would_send() -> None:
    """``infer_request`` builds the request straight from the tensors; tritonclient's own builder
    (``tritonclient/grpc/_utils.py``, ``_get_inference_request`` over ``InferInput``s, what its
    ``stream_infer`` sends) is the authority for the bytes on the wire: every tensor kind the gateway
    sends (INT32, BOOL, FP32, UINT64, BYTES; a prompt, scalars, lists and a guide's text)."""
    tensors = request_tensors(
        [3, 1000, 8191],
        64,
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        seed=2**63 + 5,
        end_id=2,
        stop_token_ids=[2, 7],
        priority=1,
        cache_scope="acme",
        ignore_eos=True,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        repetition_penalty=1.1,
        logit_bias=[(5, -100.0), (9, 2.5)],
        guide=Guide(GuideKind.JSON_SCHEMA, '{"type": "object"}'),
        logprobs=3,
        n=2,
        prompt_logprobs=True,
    )
    theirs = tritonclient_utils._get_inference_request(
        model_name="sluice-tiny",
        inputs=to_infer_inputs(tensors),
        model_version="",
        request_id="req-1",
        outputs=None,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        parameters=None,
    )
    ours = infer_request("sluice-tiny", tensors, "req-1")
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)
    empty = {"cache_scope": np.array([[b""]], dtype=np.object_)}
    assert infer_request("m", empty) == tritonclient_utils._get_inference_request(
        "m", to_infer_inputs(empty), "", "", None, 0, False, False, 0, None, None
    )
