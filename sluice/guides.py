"""How a structured-output ``Guide`` becomes llguidance's grammar: one definition, shared by the gateway,
which checks a guide at admission, and the CPU engine, which compiles it (the same text either way, so
what the gateway accepts the engine compiles).

JSON is generated compactly, as Python's ``json.dumps`` writes it (``", "`` and ``": "``, no other
whitespace): a model that may put any whitespace anywhere can spend its whole budget on it, and OpenAI's
answers read this way too.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import llguidance

from sluice.wire import Guide, GuideKind

if TYPE_CHECKING:  # the options' type exists only in the package's stub
    from llguidance._lib import JsonCompileOptions

# How a JSON answer is laid out (see the module docstring).
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# Compilation is bounded by llguidance's fuel (its limits' units: ~50k a millisecond for the initial lexer),
# so a hostile schema is refused in well under a second instead of holding the engine's step.
COMPILE_LIMITS = llguidance.LLParserLimits(initial_lexer_fuel=10_000_000, max_grammar_size=500_000)


class GrammarError(ValueError):
    """A guide the library cannot compile, or a keyword it does not support: the caller's request."""


def grammar_text(guide: Guide) -> str:
    """``guide`` in llguidance's grammar form. Raises ``GrammarError`` on text that is not what its kind
    says (a schema that is not JSON, say)."""
    try:
        if guide.kind is GuideKind.JSON:
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
        if guide.kind is GuideKind.JSON_SCHEMA:
            return llguidance.LLMatcher.grammar_from_json_schema(json.loads(guide.text), defaults=JSON_LAYOUT)
        if guide.kind is GuideKind.REGEX:
            return llguidance.LLMatcher.grammar_from_regex(guide.text)
        return llguidance.grammar_from("grammar", guide.text)
    except (ValueError, TypeError) as exc:
        raise GrammarError(f"the {guide.kind.value} guide is not valid: {exc}") from None
