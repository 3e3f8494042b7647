"""``chunk_from_response`` (the stream's responses read straight from the protobuf) gives exactly what
``chunk_from_result`` gives for ``InferResult`` of the same response: the same chunk, or the same error,
for every response kind the CPU engine's model sends (tokens, the final totals, a refusal, Triton's own
error) and for forms it does not (contents not raw, an odd datatype, a missing or short output)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from bench.fake_replica import token_response
from sluice.triton.client import chunk_from_response, chunk_from_result
from sluice.wire import EngineErrorKind

Tensors = dict[str, np.ndarray]
DATATYPES = {np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64", np.dtype(np.object_): "BYTES"}


def response_of(tensors: Tensors, *, raw: bool = True, error_message: str = "") -> Any:
    """A ``ModelStreamInferResponse`` carrying ``tensors`` as Triton serializes them (raw contents)."""
    infer = service_pb2.ModelInferResponse(model_name="m", model_version="1")
    for name, array in tensors.items():
        out = infer.outputs.add(name=name, datatype=DATATYPES[array.dtype])
        out.shape.extend(array.shape)
        if array.dtype == np.object_:
            data = serialize_byte_tensor(array).item() if array.size else b""
        else:
            data = array.tobytes()
        if raw:
            infer.raw_output_contents.append(data)
        elif array.dtype == np.int32:
            out.contents.int_contents.extend(array.reshape(-1).tolist())
        elif array.dtype == np.object_:
            out.contents.bytes_contents.extend(array.reshape(-1).tolist())
    return service_pb2.ModelStreamInferResponse(infer_response=infer, error_message=error_message)


def tokens(ids: list[int]) -> Tensors:
    """``response_tensors`` of model_repository/cpu_engine/1/replica_converters.py."""
    return {
        "output_ids": np.asarray(ids, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(ids)]], dtype=np.int32),
    }


def final(ids: list[int], reason: str, num_prompt: int, num_cached: int) -> Tensors:
    return tokens(ids) | {
        "finish_reason": np.array([[reason.encode()]], dtype=np.object_),
        "num_prompt_tokens": np.array([[num_prompt]], dtype=np.int32),
        "num_cached_tokens": np.array([[num_cached]], dtype=np.int32),
    }


def error(kind: bytes, message: bytes) -> Tensors:
    return {
        "error_kind": np.array([[kind]], dtype=np.object_),
        "error_message": np.array([[message]], dtype=np.object_),
    }


def outcome(decode: Callable[[], Any]) -> Any:
    """What a decoder gave: the chunk, or the error's type and what it says."""
    try:
        return decode()
    except Exception as exc:
        kind = getattr(exc, "kind", None)
        return (type(exc), str(exc), kind)


def generic(response: Any) -> Any:
    """What GenerateStream did before: tritonclient's stream, then ``chunk_from_result``."""
    if response.error_message:
        raise InferenceServerException(msg=response.error_message)
    return chunk_from_result(InferResult(response.infer_response))


def assert_same(response: Any) -> None:
    fast = outcome(lambda: chunk_from_response(response))
    assert fast == outcome(lambda: generic(response))


CASES: dict[str, Tensors] = {
    "one token": tokens([1234]),
    "several tokens": tokens([5, 6, 7, 2**31 - 1, -1]),
    "no token": tokens([]),
    "final stop": final([7], "stop", 3, 0),
    "final length": final([7, 8], "length", 128, 64),
    "final abort, no token": final([], "abort", 5, 5),
    "final without reason": final([1], "", 2, 0),
    "refused": error(EngineErrorKind.INVALID_REQUEST.value.encode(), b"input_ids[1] out of range"),
    "failed": error(EngineErrorKind.ENGINE_ERROR.value.encode(), b"step failed"),
    "unknown kind": error(b"overloaded", b"busy"),
    "kind without message": {"error_kind": np.array([[b"engine_error"]], dtype=np.object_)},
    "message not utf-8": error(b"engine_error", b"\xff\xfe bad"),
    "reason not utf-8": final([1], "stop", 1, 0) | {"finish_reason": np.array([[b"\xff"]], dtype=np.object_)},
    "reason without totals": tokens([1]) | {"finish_reason": np.array([[b"stop"]], dtype=np.object_)},
    "no output_ids": {"sequence_length": np.array([[0]], dtype=np.int32)},
    "int64 ids": {"output_ids": np.array([[[1, 2]]], dtype=np.int64)},
    "int64 totals": final([1], "stop", 1, 0) | {"num_prompt_tokens": np.array([[9]], dtype=np.int64)},
    "two reasons": final([1], "stop", 1, 0)
    | {"finish_reason": np.array([[b"stop", b"length"]], dtype=np.object_)},
    "wide totals": final([1], "stop", 1, 0) | {"num_cached_tokens": np.array([[4, 5]], dtype=np.int32)},
    "ids and an error": tokens([1]) | error(b"engine_error", b"both"),
}


@pytest.mark.parametrize("tensors", CASES.values(), ids=CASES.keys())
def test_every_kind_of_response_decodes_as_the_generic_decoder_does(tensors: Tensors) -> None:
    assert_same(response_of(tensors))


@pytest.mark.parametrize("name", ["one token", "final stop", "refused"])
def test_contents_that_are_not_raw_decode_as_the_generic_decoder_does(name: str) -> None:
    assert_same(response_of(CASES[name], raw=False))


def test_a_triton_error_raises_as_tritonclient_raised_it() -> None:
    response = response_of({}, error_message="in ensemble 'x': the model crashed")
    fast = outcome(lambda: chunk_from_response(response))
    assert fast == outcome(lambda: generic(response))
    assert fast[0] is InferenceServerException and "the model crashed" in fast[1]


def test_a_shape_that_does_not_match_the_contents_fails_as_the_generic_decoder_does() -> None:
    response = response_of(tokens([1, 2]))
    del response.infer_response.outputs[0].shape[:]
    response.infer_response.outputs[0].shape.extend([1, 1, 3])
    assert_same(response)


def test_a_repeated_output_reads_the_first_as_the_generic_decoder_does() -> None:
    response = response_of(tokens([1]))
    infer = response.infer_response
    repeat = infer.outputs.add(name="output_ids", datatype="INT32")
    repeat.shape.extend([1, 1, 1])
    infer.raw_output_contents.append(np.array([9], dtype=np.int32).tobytes())
    assert_same(response)
    assert chunk_from_response(response).token_ids == [1]


def test_the_fake_replicas_responses_decode_as_the_engines_do() -> None:
    assert chunk_from_response(token_response([3, 4])).token_ids == [3, 4]
    chunk = chunk_from_response(token_response([5], ("length", 12, 4)))
    assert (chunk.token_ids, chunk.finish_reason, chunk.num_prompt_tokens, chunk.num_cached_tokens) == (
        [5],
        "length",
        12,
        4,
    )


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=8),
    final_fields=st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from(["stop", "length", "abort", ""]),
            st.integers(0, 2**31 - 1),
            st.integers(0, 2**31 - 1),
        ),
    ),
    order=st.randoms(use_true_random=False),
    drop=st.sets(st.sampled_from(["sequence_length", "num_cached_tokens", "num_prompt_tokens"]), max_size=1),
)
def test_random_responses_decode_as_the_generic_decoder_does(
    ids: list[int], final_fields: tuple[str, int, int] | None, order: Any, drop: set[str]
) -> None:
    tensors = tokens(ids) if final_fields is None else final(ids, *final_fields)
    for name in drop:
        tensors.pop(name, None)
    items = list(tensors.items())
    order.shuffle(items)
    assert_same(response_of(dict(items)))
