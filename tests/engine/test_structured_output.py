"""Structured output in the CPU engine: with the random-weight dev model, every guided answer that ends
(``stop``) parses as JSON and validates against its schema, for hundreds of schemas (hand-written and
hypothesis-generated), greedy and sampled, many in one batch; an answer cut by max_tokens says
``length``; a guide the library cannot compile is refused at add (the caller's error)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from cpu_engine.config import EngineConfig
from cpu_engine.engine import LLMEngine
from cpu_engine.grammar import GrammarError
from cpu_engine.sampling import SamplingParams
from sluice.wire import FinishReason, Guide, GuideKind

PROMPT = [5, 6, 7, 8, 9, 10]
MAX_TOKENS = 600


@pytest.fixture(scope="module")
def engine(dev_checkpoint: Path) -> LLMEngine:
    return LLMEngine.from_checkpoint(
        dev_checkpoint, EngineConfig(num_kv_blocks=2048, max_num_running=64, step_token_budget=2048)
    )


@pytest.fixture(scope="module")
def tokenizer(dev_checkpoint: Path) -> Tokenizer:
    return Tokenizer.from_file(str(dev_checkpoint / "tokenizer.json"))


def run_all(
    engine: LLMEngine, requests: dict[str, SamplingParams]
) -> dict[str, tuple[list[int], FinishReason]]:
    """Add every request, step until all finish; each one's output ids and finish reason."""
    for request_id, params in requests.items():
        engine.add_request(request_id, PROMPT, params, cache_scope="t")
    tokens: dict[str, list[int]] = {r: [] for r in requests}
    reasons: dict[str, FinishReason] = {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                assert out.finish_reason is not None
                reasons[out.request_id] = out.finish_reason
    return {r: (tokens[r], reasons[r]) for r in requests}


def guided(
    schema: dict[str, Any] | None, seed: int | None = None, max_tokens: int = MAX_TOKENS
) -> SamplingParams:
    guide = Guide(GuideKind.JSON) if schema is None else Guide(GuideKind.JSON_SCHEMA, json.dumps(schema))
    if seed is None:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, guide=guide)
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, guide=guide)


def check_answers(
    engine: LLMEngine, tokenizer: Tokenizer, schemas: list[dict[str, Any]], sampled: bool
) -> None:
    requests = {f"r{i}": guided(s, seed=i if sampled else None) for i, s in enumerate(schemas)}
    for request_id, (ids, reason) in run_all(engine, requests).items():
        schema = schemas[int(request_id[1:])]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        assert reason is FinishReason.STOP, (schema, text)
        jsonschema.validate(json.loads(text), schema)


# Bounded, so that a random model finishes every answer well inside MAX_TOKENS.
def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 8)),
        st.builds(
            lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
            st.integers(-1000, 1000),
            st.integers(0, 5000),
        ),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.builds(
            lambda values: {"enum": values},
            st.lists(st.text("abcxyz ", min_size=1, max_size=5), min_size=1, max_size=4, unique=True),
        ),
        st.builds(lambda v: {"const": v}, st.integers(-5, 5)),
        st.builds(lambda n: {"type": "string", "pattern": f"^[a-f0-9]{{{n}}}$"}, st.integers(1, 6)),
    )


def _extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    names = st.text("abcdefghij_", min_size=1, max_size=6)
    objects = st.builds(
        lambda props: {
            "type": "object",
            "properties": props,
            "required": sorted(props),
            "additionalProperties": False,
        },
        st.dictionaries(names, children, min_size=1, max_size=4),
    )
    arrays = st.builds(
        lambda item, n: {"type": "array", "items": item, "maxItems": n}, children, st.integers(0, 3)
    )
    any_of = st.builds(lambda a, b: {"anyOf": [a, b]}, children, children)
    return st.one_of(objects, arrays, any_of)


SCHEMAS = st.recursive(_leaf(), _extend, max_leaves=8).map(
    lambda s: (
        s
        if s.get("type") == "object"
        else {"type": "object", "properties": {"v": s}, "required": ["v"], "additionalProperties": False}
    )
)


def obj(**properties: Any) -> dict[str, Any]:
    """An object schema whose properties are all required and no others allowed."""
    return {
        "type": "object",
        "properties": properties,
        "required": sorted(properties),
        "additionalProperties": False,
    }


def integer(lo: int, hi: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


HAND_WRITTEN: list[dict[str, Any]] = [
    obj(name={"type": "string", "maxLength": 10}, age=integer(0, 130)),
    obj(ok={"type": "boolean"}),
    obj(tags={"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3}),
    {**obj(a={"$ref": "#/$defs/p"}, b={"$ref": "#/$defs/p"}), "$defs": {"p": obj(x=integer(0, 9))}},
    obj(when={"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}, kind={"const": "event"}),
    obj(v={"anyOf": [{"type": "null"}, integer(1, 3)]}),
]


@pytest.mark.slow
def test_hand_written_schemas_greedy_and_sampled(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    check_answers(engine, tokenizer, HAND_WRITTEN, sampled=False)
    check_answers(engine, tokenizer, HAND_WRITTEN * 4, sampled=True)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(SCHEMAS, min_size=24, max_size=24))
def test_generated_schemas_in_one_batch(
    engine: LLMEngine, tokenizer: Tokenizer, batch: list[dict[str, Any]]
) -> None:
    """8 batches of 24 hypothesis-generated schemas (192), sampled, all in one batch each."""
    check_answers(engine, tokenizer, batch, sampled=True)


def test_any_json_object(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    """``json_object``: any JSON object, which a random model rarely closes within a short budget: each
    answer either ends as a JSON object or is cut at max_tokens with ``length``."""
    outcomes = run_all(engine, {f"o{i}": guided(None, seed=i, max_tokens=64) for i in range(8)})
    for ids, reason in outcomes.values():
        text = tokenizer.decode(ids, skip_special_tokens=True)
        assert text.startswith("{")
        if reason is FinishReason.STOP:
            assert isinstance(json.loads(text), dict)
        else:
            assert reason is FinishReason.LENGTH and len(ids) == 64


def test_a_cut_answer_says_length(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    schema = HAND_WRITTEN[0]
    ((ids, reason),) = run_all(engine, {"cut": guided(schema, max_tokens=3)}).values()
    assert reason is FinishReason.LENGTH and len(ids) == 3
    with pytest.raises(json.JSONDecodeError):
        json.loads(tokenizer.decode(ids, skip_special_tokens=True))


def test_guided_and_free_rows_share_a_batch(engine: LLMEngine, tokenizer: Tokenizer) -> None:
    """A guided row's mask changes no other row: the free rows make what they make alone."""
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = run_all(engine, {"free": free})["free"]
    mixed = run_all(
        engine, {"g0": guided(HAND_WRITTEN[0]), "free": free, "g1": guided(HAND_WRITTEN[1], seed=3)}
    )
    assert mixed["free"] == alone
    jsonschema.validate(
        json.loads(tokenizer.decode(mixed["g0"][0], skip_special_tokens=True)), HAND_WRITTEN[0]
    )


@pytest.mark.parametrize(
    ("guide", "words"),
    [
        (Guide(GuideKind.JSON_SCHEMA, "{not json"), "not valid"),
        (Guide(GuideKind.JSON_SCHEMA, json.dumps(obj(a={"$ref": "#/$defs/none"}))), "cannot be used"),
        (Guide(GuideKind.REGEX, "(unclosed"), "cannot be used"),
    ],
)  # fmt: skip
def test_a_guide_that_cannot_compile_is_refused_at_add(engine: LLMEngine, guide: Guide, words: str) -> None:
    with pytest.raises(GrammarError, match=words):
        engine.add_request("bad", PROMPT, SamplingParams(max_tokens=4, guide=guide), cache_scope="t")
    assert not engine.has_unfinished()


def test_ignore_eos_with_a_guide_is_refused() -> None:
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(max_tokens=4, ignore_eos=True, guide=Guide(GuideKind.JSON))


def test_compiled_guides_are_cached(engine: LLMEngine) -> None:
    assert engine.grammar is not None
    guide = Guide(GuideKind.JSON_SCHEMA, json.dumps(HAND_WRITTEN[1]))
    engine.grammar.matcher(guide)
    before = engine.grammar.num_compiled
    first, second = engine.grammar.matcher(guide), engine.grammar.matcher(guide)
    assert engine.grammar.num_compiled == before and first is not second  # each its own state
