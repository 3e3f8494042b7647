"""OpenAI's rules for a strict schema (gateway/openai/strict_schema.py): where a schema breaks them, in
OpenAI's words, for a response_format and for a tool's function; a schema that is not strict is not
checked."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from gateway.errors import OpenAIError
from gateway.openai.schemas import ChatCompletionRequest, ResponseFormat
from gateway.openai.strict_schema import strict_schema_problem
from gateway.openai.structured import guide_of
from gateway.openai.tools import tool_plan
from sluice.tool_parsers import HERMES

ADDITIONAL = "'additionalProperties' is required to be supplied and to be false."


def _object(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
        **extra,
    }


SOUND = _object(
    {
        "name": {"type": "string"},
        "address": _object({"city": {"type": "string"}}),
        "pets": {"type": "array", "items": _object({"kind": {"enum": ["cat", "dog"]}})},
        "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "home": {"$ref": "#/$defs/place"},
    },
    **{"$defs": {"place": _object({"x": {"type": "number"}})}},
)


def test_a_sound_strict_schema_and_schemas_without_objects_pass() -> None:
    assert strict_schema_problem(SOUND) is None
    assert strict_schema_problem({"type": "string"}) is None
    assert strict_schema_problem(_object({})) is None  # no properties: nothing to require


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
         f"In context=(), {ADDITIONAL}"),
        ({**SOUND, "additionalProperties": True}, f"In context=(), {ADDITIONAL}"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, f"In context=(), {ADDITIONAL}"),
        (_object({"a": {"type": "string"}, "b": {"type": "integer"}}, required=["a"]),
         "In context=(), 'required' is required to be supplied and to be an array including every key in "
         "properties. Missing 'b'."),
        ({**_object({"a": {"type": "string"}}), "required": "a"},
         "In context=(), 'required' is required to be supplied and to be an array including every key in "
         "properties. Missing 'a'."),
        (_object({"address": {**_object({"city": {"type": "string"}}), "additionalProperties": None}}),
         f"In context=('properties', 'address'), {ADDITIONAL}"),
        (_object({"pets": {"type": "array", "items": {"properties": {"kind": {"type": "string"}}}}}),
         f"In context=('properties', 'pets', 'items'), {ADDITIONAL}"),
        (_object({"n": {"anyOf": [{"type": "null"}, {"type": ["object", "null"]}]}}),
         f"In context=('properties', 'n', 'anyOf', 1), {ADDITIONAL}"),
        ({**SOUND, "$defs": {"place": {"type": "object"}}}, f"In context=('$defs', 'place'), {ADDITIONAL}"),
    ],
)  # fmt: skip
def test_where_a_strict_schema_breaks_the_rules_in_openais_words(
    schema: dict[str, Any], problem: str
) -> None:
    assert strict_schema_problem(schema) == problem


def _format(schema: dict[str, Any], strict: bool | None) -> ResponseFormat:
    spec = {"name": "answer", "schema": schema, **({} if strict is None else {"strict": strict})}
    return msgspec.convert({"type": "json_schema", "json_schema": spec}, ResponseFormat)


LAX = {"type": "object", "properties": {"a": {"type": "string"}}}


def test_a_strict_response_format_that_breaks_the_rules_is_a_400_naming_it() -> None:
    with pytest.raises(OpenAIError) as refused:
        guide_of(_format(LAX, strict=True))
    assert refused.value.status_code == 400 and refused.value.param == "response_format"
    assert (
        refused.value.message == f"Invalid schema for response_format 'answer': In context=(), {ADDITIONAL}"
    )
    assert refused.value.code is None  # as OpenAI's chat completions answer it
    for strict in (False, None):  # not strict: served as given (decoding still follows it)
        assert guide_of(_format(LAX, strict)) is not None
    assert guide_of(_format(SOUND, strict=True)) is not None


def _tools_request(parameters: dict[str, Any] | None, strict: bool) -> ChatCompletionRequest:
    function: dict[str, Any] = {"name": "lookup", "strict": strict}
    if parameters is not None:
        function["parameters"] = parameters
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [
            {"type": "function", "function": {"name": "other"}},
            {"type": "function", "function": function},
        ],
    }
    return msgspec.convert(body, ChatCompletionRequest, strict=True)


def test_a_strict_function_that_breaks_the_rules_is_a_400_naming_it() -> None:
    with pytest.raises(OpenAIError) as refused:
        tool_plan(_tools_request(LAX, strict=True), HERMES)
    assert refused.value.param == "tools[1].function.parameters"
    assert refused.value.message == f"Invalid schema for function 'lookup': In context=(), {ADDITIONAL}"
    assert tool_plan(_tools_request(LAX, strict=False), HERMES) is not None
    assert tool_plan(_tools_request(SOUND, strict=True), HERMES) is not None
    assert tool_plan(_tools_request(None, strict=True), HERMES) is not None  # no arguments: nothing to break
