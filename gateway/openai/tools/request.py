"""The request side of tool calls: the tools and the choice validated (400 with ``param``), the guide a
forced call is decoded by, the tools and calls as chat templates take them, and a version's parser."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.errors import invalid_request
from gateway.openai.schemas import ChatCompletionRequest, Tool, ToolCall
from gateway.openai.strict_schema import strict_schema_problem
from gateway.openai.tools.reader import ToolCallReader, ToolMode, new_call_id
from sluice.wire import Guide, GuideKind

log = logging.getLogger(__name__)

MAX_TOOLS = 128
# The calls a ``required`` answer may hold when calls are parallel: the grammar closes the array there (a
# model that never chooses to close it would otherwise run to max_tokens).
MAX_REQUIRED_CALLS = 8
MAX_SCHEMA_BYTES = 64 * 1024  # a tool guide's schema text (as gateway.openai.structured bounds one)
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    """How a request's tools are served (module docstring)."""

    mode: ToolMode
    parser: str  # the ``auto`` parser (PARSERS)
    names: tuple[str, ...]  # the declared functions
    parallel: bool  # parallel_tool_calls (OpenAI's default: true)
    named: str | None = None  # NAMED: the function
    guide: Guide | None = None  # REQUIRED / NAMED: what decoding is constrained to
    guide_param: str = "tools"  # the param a guide that does not compile is refused under

    @property
    def reads_calls(self) -> bool:
        """Whether the answer is read for calls (not ``none``)."""
        return self.mode is not ToolMode.NONE

    def reader(self, call_id: Callable[[], str] = new_call_id) -> ToolCallReader:
        """A reader for one choice's text."""
        return ToolCallReader(self.mode, self.parser, self.names, self.parallel, self.named, call_id)


def tool_plan(req: ChatCompletionRequest, parser: str | None) -> ToolPlan | None:
    """The request's tools as served by a version whose tool-call parser is ``parser`` (None: unknown,
    the version serves no tools). None when it has no tools (``tool_choice`` ``none`` or absent). Raises
    a 400 naming the param for what cannot be served."""
    choice = req.tool_choice
    if req.tools is None:
        if choice is not None and choice != "none":
            raise invalid_request(
                "tool_choice is only allowed when 'tools' are specified.", param="tool_choice"
            )
        return None  # parallel_tool_calls alone changes nothing
    tools = req.tools
    if not tools:
        raise invalid_request("'tools' must hold at least one tool (or be left out).", param="tools")
    if len(tools) > MAX_TOOLS:
        raise invalid_request(f"At most {MAX_TOOLS} tools are supported, got {len(tools)}.", param="tools")
    names: list[str] = []
    for i, tool in enumerate(tools):
        if tool.function.name in names:
            raise invalid_request(
                f"Function names must be unique: {tool.function.name!r} is declared twice.",
                param=f"tools[{i}].function.name",
            )
        names.append(tool.function.name)
        parameters = tool.function.parameters  # none: no arguments, which breaks no rule
        if tool.function.strict and parameters and (problem := strict_schema_problem(parameters)) is not None:
            raise invalid_request(
                f"Invalid schema for function '{tool.function.name}': {problem}",
                param=f"tools[{i}].function.parameters",
            )
    if parser is None:
        raise invalid_request(
            f"Model '{req.model}' (this version) does not serve tools: its tool-call parser is not one this "
            "gateway knows.",
            param="tools",
        )
    parallel = req.parallel_tool_calls is not False
    if choice is None or choice == "auto":
        return ToolPlan(ToolMode.AUTO, parser, tuple(names), parallel)
    if choice == "none":
        return ToolPlan(ToolMode.NONE, parser, tuple(names), parallel)
    if req.response_format is not None and req.response_format.type != "text":
        raise invalid_request(
            "A tool_choice that forces a call cannot be combined with a JSON response_format.",
            param="tool_choice",
        )
    if req.ignore_eos:
        raise invalid_request("ignore_eos cannot be combined with a forced tool call.", param="ignore_eos")
    if choice == "required":
        guide = tool_guide(tools, None, parallel)
        return ToolPlan(ToolMode.REQUIRED, parser, tuple(names), parallel, None, guide, "tools")
    assert not isinstance(choice, str)
    name = choice.function.name
    if name not in names:
        raise invalid_request(
            f"tool_choice names function {name!r}, which is not in 'tools'.", param="tool_choice"
        )
    param = f"tools[{names.index(name)}].function.parameters"
    return ToolPlan(
        ToolMode.NAMED, parser, tuple(names), parallel, name, tool_guide(tools, name, parallel), param
    )


def _parameters(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters if tool.function.parameters is not None else NO_ARGUMENTS


def call_schema(tool: Tool) -> dict[str, Any]:
    """The JSON schema of one call of ``tool``: its name, then its arguments (in that order: the engine
    writes properties in the schema's order, so the name comes first)."""
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": _parameters(tool)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_guide(tools: list[Tool], named: str | None, parallel: bool) -> Guide:
    """What decoding is constrained to: ``named``'s arguments (its parameters schema), or, for
    ``required`` (``named`` None), one call of any tool, or an array of 1 to ``MAX_REQUIRED_CALLS`` when
    ``parallel``.
    A 400 for a schema over ``MAX_SCHEMA_BYTES``."""
    if named is not None:
        index = next(i for i, t in enumerate(tools) if t.function.name == named)
        schema, param = _parameters(tools[index]), f"tools[{index}].function.parameters"
    else:
        calls = [call_schema(t) for t in tools]
        one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
        array = {"type": "array", "items": one, "minItems": 1, "maxItems": MAX_REQUIRED_CALLS}
        schema, param = (array if parallel else one), "tools"
    # NOTE: keys keep their order (no sort_keys): the order of properties is the order they are written.
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise invalid_request(
            f"The tools' schema for a forced call is {len(text.encode())} bytes; at most {MAX_SCHEMA_BYTES}.",
            param=param,
        )
    return Guide(GuideKind.JSON_SCHEMA, text)


def template_tools(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as Hugging Face chat templates take them (``tools=[{"type": "function", "function":
    {...}}]``, unset fields left out), or None."""
    if not req.tools:
        return None
    return [
        {"type": "function", "function": {k: v for k, v in _function_fields(t).items() if v is not None}}
        for t in req.tools
    ]


def _function_fields(tool: Tool) -> dict[str, Any]:
    f = tool.function
    return {"name": f.name, "description": f.description, "parameters": f.parameters, "strict": f.strict}


def template_tool_call(call: ToolCall) -> dict[str, Any]:
    """An assistant message's call as templates take it: the arguments as an object when they are one
    (Hugging Face's convention; vLLM does the same), else the text as sent."""
    arguments: Any = call.function.arguments
    try:
        parsed = json.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        arguments = parsed
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": arguments},
    }
