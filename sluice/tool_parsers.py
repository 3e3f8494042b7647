"""Which tool-call parser reads a model version's answers: the registry version's
``build_config["tool_call_parser"]`` (``hermes`` when it names none). The parsers themselves are the
gateway's (``gateway.openai.tools``); routing reads the name from here when it builds a version's target.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

HERMES, LLAMA3_JSON = "hermes", "llama3_json"
PARSERS = frozenset({HERMES, LLAMA3_JSON})
DEFAULT_PARSER = HERMES

BUILD_CONFIG_KEY = "tool_call_parser"


def tool_call_parser_of(build_config: Mapping[str, Any] | None) -> str | None:
    """The tool-call parser of a version built with ``build_config`` (``hermes`` when it names none);
    None, logged once per name, for one this gateway does not implement: the version serves no tools."""
    name = (build_config or {}).get(BUILD_CONFIG_KEY, DEFAULT_PARSER)
    if isinstance(name, str) and name in PARSERS:
        return name
    _warn_unknown_parser(repr(name))
    return None


@functools.cache
def _warn_unknown_parser(name: str) -> None:
    log.warning(
        "build_config.%s %s is not one of %s: its versions serve no tools (a request with tools is a 400)",
        BUILD_CONFIG_KEY, name, sorted(PARSERS),
    )  # fmt: skip
