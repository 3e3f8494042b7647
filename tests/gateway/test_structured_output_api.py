"""Structured output through the API (issue 25), with the official client, in process and through a real
tritonserver: ``beta.chat.completions.parse`` with a pydantic model returns the parsed object; a
``json_schema`` answer streams and validates; ``json_object`` gives a JSON object (or ``length``); a cut
answer says ``length``; a schema that cannot be compiled, or a malformed ``response_format``, is a 400
naming it, before any engine work."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from harness import MODEL, RunningGateway
from pydantic import BaseModel, Field

USER = [{"role": "user", "content": "Describe a person as JSON."}]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    member: bool


@pytest.fixture(scope="module", params=["inprocess", "triton"])
def gateway(request: pytest.FixtureRequest) -> RunningGateway:
    fixture: RunningGateway = request.getfixturevalue(f"{request.param}_gateway")
    return fixture


def _schema_format(schema: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": strict}}


def test_parse_returns_the_pydantic_object(gateway: RunningGateway) -> None:
    for seed in range(3):
        completion = gateway.client().beta.chat.completions.parse(
            model=MODEL, messages=USER, response_format=Person, max_tokens=200, temperature=1.0, seed=seed
        )  # fmt: skip
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)
        assert choice.message.parsed == Person.model_validate_json(choice.message.content or "")


@pytest.mark.parametrize("strict", [True, False])
def test_a_streamed_schema_answer_validates(gateway: RunningGateway, strict: bool) -> None:
    stream = gateway.client().chat.completions.create(
        model=MODEL, messages=USER, response_format=_schema_format(PERSON, strict), max_tokens=200,  # type: ignore[arg-type]
        temperature=0.9, seed=11, stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, reasons, usage = [], [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            reasons.append(choice.finish_reason)
    assert reasons[-1] == "stop" and len([r for r in reasons if r]) == 1
    assert len([p for p in pieces if p]) > 1  # it streamed, piece by piece
    jsonschema.validate(json.loads("".join(pieces)), PERSON)
    assert usage is not None and usage.completion_tokens > 0


def test_json_object_is_an_object_or_says_length(gateway: RunningGateway) -> None:
    for seed in range(3):
        completion = gateway.client().chat.completions.create(
            model=MODEL, messages=USER, response_format={"type": "json_object"}, max_tokens=48,
            temperature=1.0, seed=seed,
        )  # fmt: skip
        choice = completion.choices[0]
        text = choice.message.content or ""
        assert text.startswith("{")
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(text), dict)
        else:
            assert choice.finish_reason == "length"


def test_a_cut_answer_says_length(gateway: RunningGateway) -> None:
    completion = gateway.client().chat.completions.create(
        model=MODEL, messages=USER, response_format=_schema_format(PERSON), max_tokens=4,  # type: ignore[arg-type]
    )  # fmt: skip
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("response_format", "param", "words"),
    [
        (_schema_format({"properties": {"a": {"$ref": "#/$defs/x"}}}, strict=False), "response_format",
         "cannot be used"),
        (_schema_format({"type": "string", "format": "no-such-format"}), "response_format", "cannot be used"),
        (_schema_format({"type": "object", "not": {"type": "null"}}, strict=False), "response_format", "not"),
        # strict: OpenAI's rules for it, in its words (gateway/openai/strict_schema.py)
        (_schema_format({**PERSON, "additionalProperties": True}), "response_format",
         "Invalid schema for response_format 'person': In context=(), 'additionalProperties' is required to "
         "be supplied and to be false."),
        (_schema_format({**PERSON, "required": ["name", "tags"]}), "response_format",
         "In context=(), 'required' is required to be supplied and to be an array including every key in "
         "properties. Missing 'age'."),
        ({"type": "json_schema"}, "response_format.json_schema", "needs its"),
        ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name",
         "Missing required parameter"),
        ({"type": "xml"}, "response_format.type", "type"),
    ],
)  # fmt: skip
def test_a_format_that_cannot_be_served_is_a_400_naming_it(
    inprocess_gateway: RunningGateway, response_format: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        inprocess_gateway.client().chat.completions.create(
            model=MODEL,
            messages=USER,
            response_format=response_format,
            max_tokens=8,  # type: ignore[arg-type]
        )
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == param, error
    assert words in error["message"], error


def test_ignore_eos_with_a_json_format_is_refused(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        inprocess_gateway.client().chat.completions.create(
            model=MODEL, messages=USER, response_format={"type": "json_object"}, max_tokens=8,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
    assert isinstance(refused.value.body, dict) and refused.value.body["param"] == "ignore_eos"
