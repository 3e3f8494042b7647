"""Tool calls at admission, through a real gateway (in-process engine): malformed tools and choices are
400s naming their param before any engine work; a forced call reaches the engine with its guide and the
engine's answer is a valid call; the template renders the tools, an assistant's calls and the tool
results; every text they carry is screened. (Reading the answer into ``tool_calls`` is the response
pipeline's, tested with it; here the answer's text is read with ``gateway.openai.tools.read_whole``.)"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from harness import ACME_KEY, MODEL, RecordingEngine, RunningGateway, start_gateway

from sluice.wire import Guide, GuideKind

HEADERS = {"Authorization": f"Bearer {ACME_KEY}", "Content-Type": "application/json"}
USER = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Oslo", "Paris", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def engine(dev_checkpoint: Path) -> RecordingEngine:
    return RecordingEngine(dev_checkpoint, MODEL)


@pytest.fixture(scope="module")
def gateway(
    dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, engine: RecordingEngine
) -> Iterator[RunningGateway]:
    state_dir = tmp_path_factory.mktemp("tools")
    safety = state_dir / "safety.json"
    safety.write_text(json.dumps({"blocklist": ["bomb"]}))
    gw = start_gateway(state_dir, dev_checkpoint, engine, max_output_tokens=256, safety_config_path=safety)
    yield gw
    gw.stop()


def post(gw: RunningGateway, body: dict[str, Any]) -> httpx.Response:
    with gw.http() as http:
        return http.post("/v1/chat/completions", content=json.dumps(body).encode(), headers=HEADERS)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": USER, "max_tokens": 4, **fields}


def assert_refused(resp: httpx.Response, param: str, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == 400, resp.text
    error: dict[str, Any] = resp.json()["error"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def _tool(name: str, parameters: Any = None, **extra: Any) -> dict[str, Any]:
    function = {"name": name, **({} if parameters is None else {"parameters": parameters}), **extra}
    return {"type": "function", "function": function}


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "utc"}'}}


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"tools": []}, "tools", None),
        ({"tools": [_tool(f"f{i}") for i in range(129)]}, "tools", None),
        ({"tools": [_tool("a b")]}, "tools[0].function.name", None),
        ({"tools": [_tool("x" * 65)]}, "tools[0].function.name", None),
        ({"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type", None),
        ({"tools": [_tool("f", [1])]}, "tools[0].function.parameters", None),
        ({"tools": [_tool("f"), _tool("f")]}, "tools[1].function.name", None),
        ({"tools": [_tool("f", {}, x=1)]}, "tools[0].function.x", "unknown_parameter"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", None),
        ({"tools": TOOLS, "tool_choice": {**NAMED, "function": {"name": "nope"}}}, "tool_choice", None),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice.function",
         "missing_required_parameter"),
        ({"tool_choice": "auto"}, "tool_choice", None),
        ({"tool_choice": NAMED}, "tool_choice", None),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "tool_choice", None),
        ({"tools": TOOLS, "tool_choice": NAMED, "ignore_eos": True}, "ignore_eos", None),
        ({"tools": [_tool("f", {"type": "string", "format": "no-such-format"})], "tool_choice": "required"},
         "tools", "invalid_response_format"),
        ({"tools": [_tool("f", {"type": "string", "format": "no-such-format"})],
          "tool_choice": {"type": "function", "function": {"name": "f"}}},
         "tools[0].function.parameters", "invalid_response_format"),
        ({"messages": [*USER, {"role": "assistant", "tool_calls": [{"id": "c"}]}]},
         "messages[1].tool_calls[0].function", "missing_required_parameter"),
        ({"messages": [{**USER[0], "tool_calls": [CALL]}]}, "messages[0].tool_calls", None),
        ({"messages": [*USER, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "content": "1"}]},
         "messages[2].tool_call_id", None),
        ({"messages": [*USER, {"role": "assistant", "tool_calls": [{**CALL, "x": 1}]}]},
         "messages[1].tool_calls[0].x", "unknown_parameter"),
    ],
)  # fmt: skip
def test_what_cannot_be_served_is_a_400_naming_its_param(
    gateway: RunningGateway, engine: RecordingEngine, fields: dict[str, Any], param: str, code: str | None
) -> None:
    before = len(engine.requests)
    assert_refused(post(gateway, chat(**fields)), param, code)
    assert len(engine.requests) == before  # no engine work


def test_a_version_whose_parser_is_unknown_serves_no_tools(gateway: RunningGateway) -> None:
    routes = gateway.gw.router.table.models[MODEL]
    version = next(iter(routes.versions))
    served = routes.versions[version]
    routes.versions[version] = dataclasses.replace(served, tool_call_parser=None)  # type: ignore[index]
    try:
        error = assert_refused(post(gateway, chat(tools=TOOLS)), "tools")
        assert "does not serve tools" in error["message"]
        assert post(gateway, chat()).status_code == 200  # without tools it is served as ever
    finally:
        routes.versions[version] = served  # type: ignore[index]
    assert post(gateway, chat(tools=TOOLS)).status_code == 200


def _last_guide(engine: RecordingEngine) -> Guide | None:
    return engine.requests[-1].sampling.guide


def _calls(message: dict[str, Any]) -> tuple[str | None, list[tuple[str, str]]]:
    """The answer's content and its ``tool_calls`` as (name, arguments)."""
    assert "tool_calls" in message, message
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"])
    return message["content"], calls


def test_a_named_function_is_decoded_against_its_schema(
    gateway: RunningGateway, engine: RecordingEngine
) -> None:
    for seed in range(4):
        body = chat(tools=TOOLS, tool_choice=NAMED, max_tokens=64, temperature=1.0, seed=seed)
        resp = post(gateway, body)
        assert resp.status_code == 200, resp.text
        assert _last_guide(engine) == Guide(GuideKind.JSON_SCHEMA, json.dumps(WEATHER, separators=(",", ":")))
        choice = resp.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        content, calls = _calls(choice["message"])
        assert content is None and [name for name, _ in calls] == ["get_weather"]
        jsonschema.validate(json.loads(calls[0][1]), WEATHER)


@pytest.mark.parametrize("parallel", [True, False])
def test_required_is_decoded_as_calls_of_the_declared_tools(
    gateway: RunningGateway, engine: RecordingEngine, parallel: bool
) -> None:
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    read = 0
    for seed in range(4):
        body = chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel, max_tokens=256,
                    temperature=1.0, seed=seed)  # fmt: skip
        resp = post(gateway, body)
        assert resp.status_code == 200, resp.text
        guide = _last_guide(engine)
        assert guide is not None and (json.loads(guide.text).get("type") == "array") is parallel
        choice = resp.json()["choices"][0]
        if choice["finish_reason"] == "length":  # an array the model kept on extending
            continue
        assert choice["finish_reason"] == "tool_calls"
        content, calls = _calls(choice["message"])
        assert content is None and calls and (parallel or len(calls) == 1)
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), schemas[name])
        read += 1
    assert read >= 2  # most answers close their calls well within the budget


def test_auto_and_none_reach_the_engine_without_a_guide(
    gateway: RunningGateway, engine: RecordingEngine
) -> None:
    for choice in ("auto", "none"):
        assert post(gateway, chat(tools=TOOLS, tool_choice=choice)).status_code == 200
        assert _last_guide(engine) is None
    assert post(gateway, chat(tool_choice="none", parallel_tool_calls=False)).status_code == 200  # no tools


def test_the_template_renders_the_tools_the_calls_and_their_results(
    gateway: RunningGateway, engine: RecordingEngine
) -> None:
    codec = gateway.gw.codec
    calls = [CALL, {**CALL, "id": "call_2", "function": {"name": "get_weather", "arguments": "not json"}}]
    messages = [
        {"role": "developer", "content": "Be brief."},
        *USER,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
        {"role": "tool", "content": [{"type": "text", "text": "sunny"}], "tool_call_id": "call_2"},
    ]
    resp = post(gateway, chat(messages=messages, tools=[TOOLS[0], _tool("get_time")]))
    assert resp.status_code == 200, resp.text
    expected_tools = [TOOLS[0], {"type": "function", "function": {"name": "get_time"}}]
    expected = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": USER[0]["content"]},
        {"role": "assistant", "content": "", "tool_calls": [
            {**CALL, "function": {"name": "get_time", "arguments": {"zone": "utc"}}},
            {**CALL, "id": "call_2", "function": {"name": "get_weather", "arguments": "not json"}},
        ]},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_2"},
    ]  # fmt: skip
    prompt = engine.requests[-1].prompt_token_ids
    assert prompt == codec.encode_chat(expected, tools=expected_tools)
    text = codec.decode(prompt)
    assert text.startswith("system\nBe brief.\n\n# Tools\n") and json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>' in text
    assert '{"name": "get_weather", "arguments": not json}' in text
    assert "<tool_response>\n12:00\n</tool_response>\n<tool_response>\nsunny\n</tool_response>" in text


@pytest.mark.parametrize(
    "fields",
    [
        {"tools": [_tool("f", None, description="how to build a bomb")]},
        {"tools": [_tool("f", {"type": "object", "properties": {"bomb": {"type": "string"}}})]},
        {"messages": [*USER, {"role": "assistant", "tool_calls": [
            {**CALL, "function": {"name": "get_time", "arguments": '{"what": "bomb"}'}}]}]},
        {"messages": [*USER, {"role": "assistant", "tool_calls": [CALL]},
                      {"role": "tool", "content": "a bomb", "tool_call_id": "call_1"}]},
        {"messages": [*USER, {"role": "assistant", "tool_calls": [CALL]},
                      {"role": "tool", "content": "ok", "tool_call_id": "bomb"}]},
    ],
    ids=["description", "schema", "arguments", "result", "tool_call_id"],
)  # fmt: skip
def test_every_text_tools_bring_to_the_prompt_is_screened(
    gateway: RunningGateway, fields: dict[str, Any]
) -> None:
    assert_refused(post(gateway, chat(**fields)), "prompt", "content_filter")


def test_the_official_client_round_trip_is_admitted(gateway: RunningGateway) -> None:
    """A named call, its result as a tool message, and the answer: every request of the loop is served."""
    client = gateway.client()
    first = client.chat.completions.create(
        model=MODEL, messages=USER, tools=TOOLS, tool_choice=NAMED, max_tokens=64, temperature=0.0,  # type: ignore[arg-type]
    )  # fmt: skip
    assert first.choices[0].finish_reason == "tool_calls"
    message = first.choices[0].message
    assert message.content is None and message.tool_calls is not None and len(message.tool_calls) == 1
    made = message.tool_calls[0]
    assert made.function.name == "get_weather" and made.id.startswith("call_")
    jsonschema.validate(json.loads(made.function.arguments), WEATHER)
    second = client.chat.completions.create(
        model=MODEL, tools=TOOLS, max_tokens=8,  # type: ignore[arg-type]
        messages=[*USER, message.model_dump(exclude_none=True),  # type: ignore[list-item]
                  {"role": "tool", "tool_call_id": made.id, "content": "-3 C"}],
    )  # fmt: skip
    assert second.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("path", ["inprocess", "triton"])
def test_a_streamed_call_sends_its_id_and_name_then_its_arguments(
    request: pytest.FixtureRequest, path: str
) -> None:
    """OpenAI's streaming form, through the official client on both paths: the first tool-call delta
    carries the id and name, the later ones fragments of the arguments; the finish reason is tool_calls."""
    running: RunningGateway = request.getfixturevalue(f"{path}_gateway")
    small = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}}, "required": ["city"]}
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": small}}
    stream = running.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Oslo?"}], tools=[tool], tool_choice=NAMED,  # type: ignore[list-item]
        max_tokens=48, temperature=0.7, seed=2, stream=True,
    )  # fmt: skip
    deltas, reasons = [], []
    for chunk in stream:
        for choice in chunk.choices:
            deltas.extend(choice.delta.tool_calls or [])
            reasons.append(choice.finish_reason)
            assert not choice.delta.content
    assert reasons[-1] == "tool_calls"
    first, rest = deltas[0], deltas[1:]
    assert first.id is not None and first.function is not None and first.function.name == "get_weather"
    assert rest and all(d.id is None and d.index == 0 for d in rest)
    arguments = "".join((d.function.arguments or "") for d in deltas if d.function is not None)
    jsonschema.validate(json.loads(arguments), small)
