"""Tool calls: OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, apart from the response
pipeline (which calls the pure pieces here).

The request: ``tool_plan(req, parser)`` validates the tools and the choice (400 with ``param``) and says
how the answer is read (``ToolPlan``):

- ``none`` (the default without tools): the template still receives the tools (as vLLM does), the
  answer is plain content;
- ``auto`` (the default with tools): the model writes what it wants; the version's tool-call parser
  (``build_config["tool_call_parser"]``, ``sluice.tool_parsers``) reads its calls out of the text;
- a named function: decoding is constrained (``tool_guide``) to the function's ``parameters`` schema, so
  the whole output is the call's arguments (vLLM's way: the name is known, the model spends no tokens
  on it);
- ``required``: decoding is constrained to the calls themselves, ``{"name": ..., "arguments": ...}``
  with the arguments decoded against the named function's schema (``anyOf`` over the tools): one such
  object when ``parallel_tool_calls`` is false, else (OpenAI's default) a JSON array of 1 to
  ``MAX_REQUIRED_CALLS`` (8) of them.

The answer: one ``ToolCallReader`` per choice turns the engine's text, piece by piece, into ``Part`` s:
content text (``str``) or a ``ToolCallDelta`` (id and name on a call's first delta, then fragments of
its arguments' JSON text), as OpenAI streams them. Concatenating what a reader returns for any split of
the text gives what it returns for the whole text (``read_whole`` for a non-streamed answer).

Parsers (``auto``):

- ``hermes`` (Hermes, Qwen 2.5/3): each ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  block is a call; text outside the blocks is content. Text that may be the start of ``<tool_call>`` is
  held back until it is known not to be; a block is buffered until it closes (so its call is sent
  whole). A block whose JSON is not a call (or names no declared tool) is sent back as content, tags
  and all; an unclosed block at the end is a call if its JSON is one, else content.
- ``llama3_json`` (Llama 3.1+): an output that starts with ``{`` and is a JSON object
  ``{"name": ..., "parameters"|"arguments": {...}}`` (several separated by ``;`` allowed) is a call;
  it is buffered while it may be one, and sent as content once it is not.

Whitespace around calls is dropped (content that is only whitespace next to a call is not content).
With ``parallel_tool_calls`` false, only the first call of an ``auto`` answer is kept; later ones are
dropped. A call's id is ``call_`` + 24 random hex digits.
"""

from gateway.openai.tools.reader import (
    Part,
    ToolCallDelta,
    ToolCallReader,
    ToolMode,
    delta_tool_call,
    new_call_id,
    read_whole,
)
from gateway.openai.tools.request import (
    MAX_REQUIRED_CALLS,
    MAX_TOOLS,
    ToolPlan,
    call_schema,
    template_tool_call,
    template_tools,
    tool_guide,
    tool_plan,
)

__all__ = [
    "MAX_REQUIRED_CALLS",
    "MAX_TOOLS",
    "Part",
    "ToolCallDelta",
    "ToolCallReader",
    "ToolMode",
    "ToolPlan",
    "call_schema",
    "delta_tool_call",
    "new_call_id",
    "read_whole",
    "template_tool_call",
    "template_tools",
    "tool_guide",
    "tool_plan",
]
