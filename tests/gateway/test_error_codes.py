"""msgspec's refusals map to the codes OpenAI's API gives the same mistakes: each case is msgspec's own
message for a real struct, so a change in its wording fails here rather than turning every code into
``invalid_value``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import pytest

from gateway.errors import invalid_field, out_of_range


class _Part(msgspec.Struct):
    role: Literal["user", "system"]
    name: Annotated[str, msgspec.Meta(pattern=r"^[a-z]{1,4}$")] | None = None


class _Body(msgspec.Struct):
    messages: list[_Part]
    n: Annotated[int, msgspec.Meta(ge=1, le=8)] | None = None
    temperature: Annotated[float, msgspec.Meta(gt=0.0, le=2.0)] | None = None
    stop: Annotated[str, msgspec.Meta(min_length=1, max_length=3)] | None = None
    ids: Annotated[list[int], msgspec.Meta(min_length=1, max_length=2)] | None = None


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "messages", "missing_required_parameter"),
        ({"messages": [{}]}, "messages[0].role", "missing_required_parameter"),
        ({"messages": [], "n": 0}, "n", "integer_below_min_value"),
        ({"messages": [], "n": 9}, "n", "integer_above_max_value"),
        ({"messages": [], "temperature": 0}, "temperature", "decimal_below_min_value"),
        ({"messages": [], "temperature": 2.5}, "temperature", "decimal_above_max_value"),
        ({"messages": [], "stop": ""}, "stop", "string_below_min_length"),
        ({"messages": [], "stop": "abcd"}, "stop", "string_above_max_length"),
        ({"messages": [], "ids": []}, "ids", "array_below_min_length"),
        ({"messages": [], "ids": [1, 2, 3]}, "ids", "array_above_max_length"),
        ({"messages": [], "n": "1"}, "n", "invalid_type"),
        ({"messages": [], "n": 1.0}, "n", "invalid_type"),
        ({"messages": "hi"}, "messages", "invalid_type"),
        ({"messages": [{"role": "robot"}]}, "messages[0].role", "invalid_value"),
        ({"messages": [{"role": "user", "name": "A B"}]}, "messages[0].name", "invalid_value"),
    ],
)
def test_msgspecs_refusal_has_openais_code_and_names_the_field(
    body: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert(body, _Body, strict=True)
    message, _, where = str(refused.value).partition(" - at `$")
    error = invalid_field(message, where.rstrip("`").lstrip("."))
    assert (error.status_code, error.param, error.code) == (400, param, code)
    assert f"'{param}'" in error.message


def test_a_refusal_of_the_body_itself_names_no_field() -> None:
    with pytest.raises(msgspec.ValidationError) as refused:
        msgspec.convert([], _Body, strict=True)
    error = invalid_field(str(refused.value), "")
    assert (error.param, error.code) == (None, "invalid_type")
    assert error.message.startswith("Invalid request body: expected `object`")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("max_tokens", -1, 1, False), "integer_below_min_value", "Expected a value >= 1, but got -1"),
        (("n", 200, 128, True), "integer_above_max_value", "Expected a value <= 128, but got 200"),
        (("top_p", 1.5, 1.0, True), "decimal_above_max_value", "Expected a value <= 1.0, but got 1.5"),
    ],
)
def test_a_number_past_its_bound_is_worded_as_openai_words_it(
    args: tuple[Any, ...], code: str, message: str
) -> None:
    error = out_of_range(*args)
    assert (error.param, error.code) == (args[0], code)
    assert message in error.message and error.message.startswith(f"Invalid '{args[0]}'")
