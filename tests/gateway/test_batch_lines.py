"""The batch input file's parsing (gateway/batches/lines.py), pure: which lines run, which are reported
in the error file, and which problems fail the whole batch."""

from __future__ import annotations

import json
from typing import Any

from gateway.batches.lines import MAX_FILE_ERRORS, BatchLine, LineProblem, parse_input, parse_line
from gateway.openai.schemas import ChatCompletionRequest

CHAT = "/v1/chat/completions"


def line(custom_id: Any = "a", **overrides: Any) -> str:
    obj = {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        **overrides,
    }
    return json.dumps(obj)


def problem_code(raw: str) -> str:
    parsed = parse_line(0, raw, CHAT)
    assert isinstance(parsed, LineProblem), parsed
    return parsed.code


def test_a_good_line_is_the_endpoints_request() -> None:
    parsed = parse_line(3, line("q1"), CHAT)
    assert isinstance(parsed, BatchLine)
    assert (parsed.index, parsed.custom_id) == (3, "q1")
    assert isinstance(parsed.body, ChatCompletionRequest) and parsed.body.model == "m"


def test_each_malformed_line_names_its_problem() -> None:
    assert problem_code("{not json") == "invalid_json_line"
    assert problem_code("[1, 2]") == "invalid_json_line"
    assert problem_code("[" * 100 + "]" * 100) == "invalid_json_line"
    assert problem_code(line(custom_id=7)) == "invalid_custom_id"
    assert problem_code(line(custom_id="")) == "invalid_custom_id"
    assert problem_code(line(custom_id="x" * 257)) == "invalid_custom_id"
    assert problem_code(line(method="GET")) == "invalid_method"
    assert problem_code(line(url="/v1/completions")) == "mismatched_url"
    assert problem_code(line(extra=1)) == "invalid_request"
    assert problem_code(line(body="hi")) == "invalid_request"
    assert problem_code(line(body={"model": "m", "messages": [], "top_a": 3})) == "invalid_request"
    assert problem_code(line(body={"model": "m", "messages": "nope"})) == "invalid_request"
    stream = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert problem_code(line(body=stream)) == "invalid_request"


def test_a_problem_keeps_the_custom_id_when_it_could_be_read() -> None:
    parsed = parse_line(0, line("keep", method="PUT"), CHAT)
    assert isinstance(parsed, LineProblem) and parsed.custom_id == "keep"
    parsed = parse_line(0, "{oops", CHAT)
    assert isinstance(parsed, LineProblem) and parsed.custom_id is None


def test_blank_lines_are_skipped_but_keep_the_numbering() -> None:
    data = "\n".join([line("a"), "", "   ", "{bad", line("b")]).encode()
    parsed = parse_input(data, CHAT, max_lines=10)
    assert parsed.errors == ()
    assert [(x.index, x.custom_id) for x in parsed.lines] == [(0, "a"), (4, "b")]
    assert [(p.index, p.code) for p in parsed.problems] == [(3, "invalid_json_line")]
    assert parsed.total == 3


def test_what_fails_the_whole_file() -> None:
    assert parse_input(b"\xff\xfe", CHAT, 10).errors[0].code == "invalid_file"
    assert parse_input(b"\n \n", CHAT, 10).errors[0].code == "empty_file"
    many = "\n".join(line(f"c{i}") for i in range(11)).encode()
    assert parse_input(many, CHAT, 10).errors[0].code == "too_many_requests"
    duplicated = "\n".join([line("a"), line("b"), line("a")]).encode()
    parsed = parse_input(duplicated, CHAT, 10)
    assert [(e.code, e.line) for e in parsed.errors] == [("duplicate_custom_id", 3)]
    assert parsed.lines == [] and parsed.problems == []


def test_the_listed_errors_are_bounded() -> None:
    # The first "same" is kept: MAX_FILE_ERRORS + 10 duplicates, the last 11 of them summed up in one.
    data = "\n".join(line("same") for _ in range(MAX_FILE_ERRORS + 11)).encode()
    errors = parse_input(data, CHAT, 1000).errors
    assert len(errors) == MAX_FILE_ERRORS
    assert "and 10 more like it" in errors[-1].message
