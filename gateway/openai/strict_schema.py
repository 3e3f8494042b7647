"""OpenAI's two rules for a schema marked ``strict: true`` (a ``response_format`` json_schema or a tool's
function): every object says ``additionalProperties: false``, and its ``required`` lists every key of its
``properties``. OpenAI refuses a strict schema that breaks either with a 400, and so does Sluice, in
OpenAI's words, so that a schema written against Sluice also works against OpenAI:

    Invalid schema for response_format 'answer': In context=('properties', 'person'), 'additionalProperties'
    is required to be supplied and to be false.
    Invalid schema for function 'lookup': In context=(), 'required' is required to be supplied and to be an
    array including every key in properties. Missing 'city'.

(the wording and the context, the path of keys from the schema's root as a Python tuple, as OpenAI's
API answers; reported by its users, e.g. langchain-ai/langchain#25169, agentscope-ai/agentscope-java#2548).
Sluice constrains decoding to a schema whether or not it is strict (gateway/openai/structured.py); these
rules are only what strict asks for. A schema that is not strict is not checked here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Where subschemas sit: under a mapping of names, in a list, or as one schema.
_NAMED = ("properties", "$defs", "definitions")
_LISTED = ("anyOf", "allOf", "oneOf", "prefixItems")
_SINGLE = ("items", "not", "additionalProperties")


def strict_schema_problem(schema: dict[str, Any]) -> str | None:
    """The first place ``schema`` breaks OpenAI's strict rules, as OpenAI words it after "Invalid schema
    for ...: ", or None."""
    for path, node in _subschemas(schema, ()):
        if not _is_object(node):
            continue
        context = f"In context={path!r}"
        if node.get("additionalProperties") is not False:
            return f"{context}, 'additionalProperties' is required to be supplied and to be false."
        properties = node.get("properties") or {}
        required = node.get("required")
        listed = required if isinstance(required, list) else []
        missing = next((key for key in properties if key not in listed), None)
        if missing is not None:
            return (
                f"{context}, 'required' is required to be supplied and to be an array including every key in "
                f"properties. Missing '{missing}'."
            )
    return None


def _is_object(node: dict[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node


def _subschemas(
    node: Any, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], dict[str, Any]]]:
    """Every schema in ``node``, depth first, with its path of keys from the root."""
    if not isinstance(node, dict):
        return
    yield path, node
    for key in _NAMED:
        named = node.get(key)
        if isinstance(named, dict):
            for name, child in named.items():
                yield from _subschemas(child, (*path, key, name))
    for key in _LISTED:
        listed = node.get(key)
        if isinstance(listed, list):
            for i, child in enumerate(listed):
                yield from _subschemas(child, (*path, key, i))
    for key in _SINGLE:
        yield from _subschemas(node.get(key), (*path, key))
