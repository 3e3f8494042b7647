"""Structured output (issue 25): llguidance against outlines-core on the model's own tokenizer, to choose
the grammar library the CPU engine constrains its decoding with. xgrammar is not measured: its wheel
requires torch, transformers and triton, which the replica does not carry.

For each of four schemas (a 20-field flat object of strings, integers, numbers, booleans and enums; a nested
object with an array of objects; ``anyOf``; ``pattern``), per library:

- compile, cold: the median of ``--repeats`` fresh compiles from the schema to the first mask (llguidance:
  its JSON-schema grammar and an ``LLMatcher``; outlines-core: its regex and an ``Index``), the tokenizer
  already built;
- compile, cached: what a request whose schema is cached pays to start (llguidance: ``deep_copy`` of the
  compiled matcher; outlines-core: a ``Guide`` over the built ``Index``);
- the mask per decoding step: the library's bitmask turned into a boolean ``[vocab]`` array that indexes
  numpy logits, over walks of ``--steps`` steps in all; and the cost of advancing past the chosen token;
- whether each walk's output parses as JSON and validates against the schema (``jsonschema``).

A walk follows a valid path: at each step it takes the allowed token that a pseudo-random logits vector
ranks highest (the same vectors for both libraries: walk k draws them from seed k), with a bonus for tokens
that contain ``"``, ``,``, ``}``, ``]``, ``@`` or ``.`` so strings, numbers and arrays close and a walk ends
in a few hundred steps; it stops where end-of-sequence is allowed. The layout is compact for both
(llguidance as the engine configures it, ``", "`` and ``": "``; outlines-core without whitespace), so the
two walk comparable paths. Then each JSON-schema keyword in ``FEATURES`` is compiled by both and walked three
times: supported (and its output valid), or refused with the library's error.

    .venv/bin/python -m bench.grammar_choice --model .sluice/models/sluice-tiny [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsonschema  # type: ignore[import-untyped]
import llguidance
import llguidance.numpy as llg_numpy
import numpy as np
import outlines_core  # type: ignore[import-untyped]
from outlines_core.json_schema import build_regex_from_schema  # type: ignore[import-untyped]

from bench.report import cpu_description, cpu_flags, load_average, pct, write_section
from sluice.text.detokenizer import byte_level_alphabet

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # a TypedDict of its stub only

SECTION = "grammar-choice"
TITLE = "## Structured output: choosing the grammar library (issue 25)"
# As cpu_engine/grammar.py lays JSON out: compact, Python's json.dumps separators.
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
CLOSE_BONUS = 2.5  # added to the logits of tokens with a closing character (see the module docstring)
CLOSERS = tuple(
    b'",}]@.'
)  # what ends a string, number, array or object, and what separates an address's parts
FEATURE_WALKS = 3
MIN_WALKS = 3  # per schema and library, however long each is
FEATURE_MAX_STEPS = 1000

Schema = dict[str, Any]


def _obj(properties: dict[str, Any], required: list[str] | None = None, extra: bool = False) -> Schema:
    """An object schema: every property required unless ``required`` says otherwise."""
    return {"type": "object", "properties": properties, "additionalProperties": extra,
            "required": list(properties) if required is None else required}  # fmt: skip


STR, INT, NUM, BOOL = ({"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"})


def _enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


FLAT, NESTED = "flat, 20 fields", "nested, array of objects"
SCHEMAS: dict[str, Schema] = {
    FLAT: _obj({
        "id": INT, "name": STR, "email": STR, "age": INT, "score": NUM, "active": BOOL,
        "role": _enum("admin", "editor", "viewer"), "city": STR, "country": STR, "postcode": STR,
        "balance": NUM, "visits": INT, "verified": BOOL,
        "plan": _enum("free", "pro", "team"), "bio": STR, "rating": NUM, "logins": INT, "newsletter": BOOL,
        "language": _enum("en", "de", "fr", "ja"), "timezone": STR,
    }),
    NESTED: _obj({
        "order_id": STR, "customer": _obj({"name": STR, "vip": BOOL}),
        "items": {"type": "array", "items": _obj({"sku": STR, "quantity": INT, "unit_price": NUM})},
        "total": NUM,
    }),
    "anyOf": _obj({
        "id": INT, "value": {"anyOf": [STR, NUM, {"type": "null"}]},
        "shape": {"anyOf": [_obj({"kind": {"const": "circle"}, "radius": NUM}),
                            _obj({"kind": {"const": "square"}, "side": NUM})]},
    }),
    "pattern": _obj({
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "phone": {"type": "string", "pattern": "^\\+[0-9]{8,12}$"},
        "version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"}, "note": STR,
    }),
}  # fmt: skip

_POINT = _obj({"x": INT, "y": INT})
_CHILDREN = {"type": "array", "items": {"$ref": "#/$defs/node"}}
_NODE = {"$defs": {"node": _obj({"value": INT, "children": _CHILDREN})}, "$ref": "#/$defs/node"}
# One schema per keyword, its constraint chosen so that a walk that ignored it would likely break it.
FEATURES: dict[str, Schema] = {
    "$ref / $defs": {"$defs": {"point": _POINT}, **_obj({"a": {"$ref": "#/$defs/point"},
                                                          "b": {"$ref": "#/$defs/point"}})},
    "anyOf": _obj({"x": {"anyOf": [INT, _obj({"y": STR})]}}),
    "oneOf": _obj({"x": {"oneOf": [INT, _obj({"y": STR})]}}),
    "allOf": {"allOf": [_obj({"a": INT}, extra=True), _obj({"b": STR}, extra=True)], "type": "object"},
    "pattern": _obj({"x": {"type": "string", "pattern": "^[a-z]{2,4}[0-9]$"}}),
    "format: date-time": _obj({"x": {"type": "string", "format": "date-time"}}),
    "format: email": _obj({"x": {"type": "string", "format": "email"}}),
    "format: uuid": _obj({"x": {"type": "string", "format": "uuid"}}),
    "minLength / maxLength": _obj({"x": {"type": "string", "minLength": 3, "maxLength": 6}}),
    "minItems / maxItems": _obj({"x": {"type": "array", "items": INT, "minItems": 2, "maxItems": 4}}),
    "enum": _obj({"x": {"enum": ["red", "green", 7, None]}}),
    "const": _obj({"x": {"const": "v1"}}),
    "additionalProperties: true": _obj({"a": INT}, extra=True),
    "additionalProperties: false": _obj({"a": INT, "b": STR}),
    "minimum / maximum": _obj({"x": {"type": "integer", "minimum": 10, "maximum": 99},
                               "y": {"type": "number", "minimum": 0, "maximum": 1}}),
    "recursive $ref": _NODE,
    "optional properties": _obj({"a": INT, "b": STR, "c": BOOL}, required=["a"]),
}  # fmt: skip


class CompileError(Exception):
    """The library refused the schema (its message)."""


# ----- the model's tokens -----
@dataclass(frozen=True)
class Tokens:
    """The model's tokenizer: its JSON (llguidance's input), each ordinary token's bytes (outlines-core's
    vocabulary and the walks' text), the end-of-sequence id and the logits' width."""

    tokenizer_json: str
    token_bytes: dict[int, bytes]  # special tokens left out: they are never allowed in an answer
    eos_id: int
    vocab_size: int

    @classmethod
    def load(cls, model: Path) -> Tokens:
        text = (model / "tokenizer.json").read_text(encoding="utf-8")
        spec = json.loads(text)
        config = json.loads((model / "tokenizer_config.json").read_text())
        added = {t["content"]: t for t in spec.get("added_tokens", [])}
        eos_id = added[config["eos_token"]]["id"] if config.get("eos_token") in added else None
        if eos_id is None:
            raise SystemExit(f"{model}: the eos token {config.get('eos_token')!r} is not an added token")
        to_bytes = _token_processor(spec.get("decoder") or {})
        special = {t["id"] for t in added.values() if t.get("special")}
        token_bytes = {i: to_bytes(tok) for tok, i in spec["model"]["vocab"].items() if i not in special}
        # Added tokens that are not special are text as written (as outlines-core's from_pretrained does).
        token_bytes |= {t["id"]: content.encode() for content, t in added.items() if not t.get("special")}
        vocab_size = max([*token_bytes, *special]) + 1
        return cls(text, token_bytes, eos_id, vocab_size)


def _token_processor(decoder: dict[str, Any]) -> Callable[[str], bytes]:
    """A vocabulary entry → the bytes it stands for, by the tokenizer's decoder, as outlines-core's own
    ``Vocabulary.from_pretrained`` processes tokens (src/vocabulary/processor.rs): byte-level BPE maps
    each stand-in character back to its byte (GPT-2's alphabet, "Ġ" → b" "); a byte-fallback
    (SentencePiece) vocabulary has ``<0xNN>`` tokens for single bytes and "▁" for the space."""
    if decoder.get("type") == "ByteLevel":
        alphabet = byte_level_alphabet()
        return lambda token: bytes(alphabet[c] for c in token)
    parts = decoder.get("decoders", []) if decoder.get("type") == "Sequence" else []
    if any(d.get("type") == "ByteFallback" for d in parts):
        space = next((d["pattern"]["String"] for d in parts if d.get("type") == "Replace"
                      and d.get("content") == " " and "String" in d.get("pattern", {})), " ")  # fmt: skip

        def fallback(token: str) -> bytes:
            if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                return bytes([int(token[3:5], 16)])
            return token.replace(space, " ").encode()

        return fallback
    raise SystemExit(f"a tokenizer decoder outlines-core cannot read: {decoder.get('type')!r}")


# ----- the two libraries behind one interface -----
class Library:
    name = ""

    def compile(self, schema: Schema) -> Any:
        raise NotImplementedError

    def start(self, compiled: Any) -> Any:
        """A fresh state at the start of ``compiled`` (the cached path)."""
        raise NotImplementedError

    def fill(self, state: Any, bitmask: np.ndarray) -> None:
        """Write the allowed tokens into ``bitmask`` (int32 [1, ceil(vocab / 32)], bit i = token i)."""
        raise NotImplementedError

    def advance(self, state: Any, token: int) -> None:
        raise NotImplementedError

    def warnings(self, compiled: Any) -> list[str]:
        return []


class Llguidance(Library):
    name = "llguidance"

    def __init__(self, tokens: Tokens) -> None:
        self.tokenizer = llguidance.LLTokenizer(tokens.tokenizer_json, eos_token=tokens.eos_id)

    def compile(self, schema: Schema) -> llguidance.LLMatcher:
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
        except Exception as exc:
            raise CompileError(str(exc)) from None
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise CompileError(matcher.get_error())
        return matcher

    def start(self, compiled: llguidance.LLMatcher) -> llguidance.LLMatcher:
        return compiled.deep_copy()

    def fill(self, state: llguidance.LLMatcher, bitmask: np.ndarray) -> None:
        llg_numpy.fill_next_token_bitmask(state, bitmask)

    def advance(self, state: llguidance.LLMatcher, token: int) -> None:
        if not state.consume_token(token):
            raise RuntimeError(f"llguidance refused token {token} it allowed: {state.get_error()}")

    def warnings(self, compiled: llguidance.LLMatcher) -> list[str]:
        return list(compiled.get_grammar_warnings())


class OutlinesCore(Library):
    name = "outlines-core"

    def __init__(self, tokens: Tokens) -> None:
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, raw in tokens.token_bytes.items():
            if token_id != tokens.eos_id:
                by_bytes.setdefault(raw, []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(tokens.eos_id, by_bytes)

    def compile(self, schema: Schema) -> Any:
        try:
            return outlines_core.Index(build_regex_from_schema(json.dumps(schema), ""), self.vocabulary)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # a Rust panic arrives as pyo3's PanicException, a BaseException
            raise CompileError(str(exc)) from None

    def start(self, compiled: Any) -> Any:
        return outlines_core.Guide(compiled)

    def fill(self, state: Any, bitmask: np.ndarray) -> None:
        state.write_mask_into(bitmask.ctypes.data, bitmask.size, bitmask.itemsize)

    def advance(self, state: Any, token: int) -> None:
        state.advance(token, return_tokens=False)


# ----- walks -----
@dataclass
class Walk:
    tokens: list[int] = field(default_factory=list)
    mask_s: list[float] = field(default_factory=list)
    advance_s: list[float] = field(default_factory=list)
    outcome: str = ""  # "finished", "unfinished", "dead end"


def allowed_of(bitmask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The bitmask as bool [vocab_size] (as the engine uses it on logits)."""
    return np.unpackbits(bitmask.view(np.uint8), bitorder="little")[:vocab_size].view(np.bool_)


def walk(lib: Library, compiled: Any, tokens: Tokens, bonus: np.ndarray, seed: int, max_steps: int) -> Walk:
    state = lib.start(compiled)
    bitmask = llg_numpy.allocate_token_bitmask(1, tokens.vocab_size)
    rng = np.random.default_rng(seed)
    out = Walk()
    for _ in range(max_steps):
        began = time.perf_counter()
        lib.fill(state, bitmask)
        allowed = allowed_of(bitmask, tokens.vocab_size)
        out.mask_s.append(time.perf_counter() - began)
        logits = rng.standard_normal(tokens.vocab_size, dtype=np.float32) + bonus
        if allowed[tokens.eos_id]:
            out.outcome = "finished"
            return out
        if not allowed.any():
            out.outcome = "dead end"
            return out
        token = int(np.argmax(np.where(allowed, logits, -np.inf)))
        began = time.perf_counter()
        lib.advance(state, token)
        out.advance_s.append(time.perf_counter() - began)
        out.tokens.append(token)
    out.outcome = "unfinished"
    return out


def closing_bonus(tokens: Tokens) -> np.ndarray:
    bonus = np.zeros(tokens.vocab_size, dtype=np.float32)
    for token_id, raw in tokens.token_bytes.items():
        if any(c in raw for c in CLOSERS):
            bonus[token_id] = CLOSE_BONUS
    return bonus


def check(schema: Schema, tokens: Tokens, w: Walk) -> str:
    """The walk's answer: "valid", or what is wrong with it."""
    if w.outcome != "finished":
        return f"{w.outcome} after {len(w.tokens)} tokens"
    text = b"".join(tokens.token_bytes.get(t, b"") for t in w.tokens).decode("utf-8", "replace")
    try:
        document = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    validator_class = jsonschema.validators.validator_for(schema)
    validator = validator_class(schema, format_checker=validator_class.FORMAT_CHECKER)
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    return (
        "valid"
        if error is None
        else f"invalid: {error.validator} fails on {_short(json.dumps(error.instance), 40)}"
    )


# ----- measurements -----
@dataclass
class SchemaResult:
    schema: str
    library: str
    error: str = ""  # the library refused the schema
    compile_ms: float = float("nan")
    cached_us: float = float("nan")
    mask_us: list[float] = field(default_factory=list)
    advance_us: list[float] = field(default_factory=list)
    walks: list[str] = field(default_factory=list)  # each walk's check
    steps: int = 0
    sample: str = ""  # the first walk's answer


def measure_schema(lib: Library, name: str, schema: Schema, tokens: Tokens, bonus: np.ndarray,
                   args: argparse.Namespace) -> SchemaResult:  # fmt: skip
    result = SchemaResult(name, lib.name)
    try:
        compiled = lib.compile(schema)  # also warms what a first compile sets up once
    except CompileError as exc:
        result.error = str(exc)
        return result
    cold: list[float] = []
    bitmask = llg_numpy.allocate_token_bitmask(1, tokens.vocab_size)
    for _ in range(args.repeats):  # to the first mask: llguidance builds its lexer's states lazily
        began = time.perf_counter()
        lib.fill(lib.start(lib.compile(schema)), bitmask)
        cold.append(time.perf_counter() - began)
    cached: list[float] = []
    for _ in range(max(args.repeats, 100)):
        began = time.perf_counter()
        lib.start(compiled)
        cached.append(time.perf_counter() - began)
    result.compile_ms, result.cached_us = statistics.median(cold) * 1e3, statistics.median(cached) * 1e6
    seed = 0
    while result.steps < args.steps or seed < MIN_WALKS:
        w = walk(lib, compiled, tokens, bonus, seed, args.max_walk_steps)
        result.mask_us += [s * 1e6 for s in w.mask_s]
        result.advance_us += [s * 1e6 for s in w.advance_s]
        result.steps += len(w.mask_s)
        result.walks.append(check(schema, tokens, w))
        if seed == 0:
            result.sample = b"".join(tokens.token_bytes.get(t, b"") for t in w.tokens).decode(
                "utf-8", "replace"
            )
        seed += 1
    return result


@dataclass
class FeatureResult:
    supported: bool
    cell: str


def measure_feature(lib: Library, schema: Schema, tokens: Tokens, bonus: np.ndarray) -> FeatureResult:
    try:
        compiled = lib.compile(schema)
    except CompileError as exc:
        return FeatureResult(False, f"refused: {_short(exc)}")
    checks = [check(schema, tokens, walk(lib, compiled, tokens, bonus, seed, FEATURE_MAX_STEPS))
              for seed in range(FEATURE_WALKS)]  # fmt: skip
    valid = sum(c == "valid" for c in checks)
    wrong = next((c for c in checks if c != "valid"), "")
    notes = [f"warns: {_short(w)}" for w in lib.warnings(compiled)[:1]]
    if wrong.startswith("invalid") or wrong.startswith("not JSON"):
        notes.insert(0, f"wrong output: {_short(wrong.removeprefix('invalid: '))}")
    elif wrong:
        notes.insert(0, wrong)
    cell = f"{'yes' if valid == len(checks) else 'compiles'}, {valid}/{len(checks)} walks valid"
    return FeatureResult(valid == len(checks), cell + "".join(f"; {n}" for n in notes))


def _short(text: object, limit: int = 110) -> str:
    one = " ".join(str(text).split()).replace("|", "/")
    return one if len(one) <= limit else one[: limit - 1] + "…"


# ----- the report -----
def schema_table(results: list[SchemaResult]) -> list[str]:
    lines = [
        "| schema | library | compile cold ms | cached start µs | mask µs p50 / p95 | advance µs p50 | "
        "steps | walks valid |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.schema} | {r.library} | refused: {_short(r.error, 60)} | | | | | |")
            continue
        valid = sum(c == "valid" for c in r.walks)
        lines.append(
            f"| {r.schema} | {r.library} | {r.compile_ms:.2f} | {r.cached_us:.1f} | "
            f"{statistics.median(r.mask_us):.1f} / {pct(r.mask_us, 95):.1f} | "
            f"{statistics.median(r.advance_us):.1f} | {r.steps} | {valid}/{len(r.walks)} |"
        )
    return lines


def feature_table(features: dict[str, dict[str, FeatureResult]], names: list[str]) -> list[str]:
    lines = ["| keyword | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [
        f"| {keyword} | " + " | ".join(row[n].cell for n in names) + " |" for keyword, row in features.items()
    ]
    totals = [sum(row[n].supported for row in features.values()) for n in names]
    lines.append("| **supported** | " + " | ".join(f"**{t} of {len(features)}**" for t in totals) + " |")
    return lines


def conclusion(
    results: list[SchemaResult], features: dict[str, dict[str, FeatureResult]], vocab_size: int
) -> list[str]:
    """The choice, with the figures it rests on (computed, so a rerun that changes them says so)."""

    def of(library: str) -> SchemaResult:
        return next(r for r in results if r.library == library and r.schema == FLAT)

    llg, oc = of(Llguidance.name), of(OutlinesCore.name)
    if llg.error or oc.error:
        return [f"No conclusion: the {FLAT} schema was refused ({llg.error or oc.error})."]
    supported = {n: sum(row[n].supported for row in features.values()) for n in (llg.library, oc.library)}
    only_oc = [
        k for k, row in features.items() if row[oc.library].supported and not row[llg.library].supported
    ]
    only_llg = [
        k for k, row in features.items() if row[llg.library].supported and not row[oc.library].supported
    ]
    all_valid = all(c == "valid" for r in results if r.library == llg.library for c in r.walks)
    chosen = supported[llg.library] >= supported[oc.library] and not only_oc and all_valid
    llg_mask, oc_mask = statistics.median(llg.mask_us), statistics.median(oc.mask_us)
    if llg.compile_ms < oc.compile_ms:
        compile_cmp = f"{oc.compile_ms / llg.compile_ms:.0f}x faster"
    else:
        compile_cmp = f"{llg.compile_ms / oc.compile_ms:.1f}x slower"
    mask_why = (
        ""
        if llg_mask <= oc_mask
        else ": outlines-core's Index precomputes every state's allowed tokens, so its mask is a lookup and "
        "its compile pays for it, walking every token through the regex's states (both that compile and "
        f"llguidance's mask grow with the vocabulary: {vocab_size:,} tokens here, 32k-150k in served models)"
    )
    return [
        f"**{'llguidance' if chosen else 'No clear choice'}.** On the 20-field flat schema llguidance "
        f"compiles cold in {llg.compile_ms:.1f} ms against outlines-core's {oc.compile_ms:.1f} ms "
        f"({compile_cmp}), and a cached schema starts in {llg.cached_us:.1f} µs against "
        f"{oc.cached_us:.1f} µs. Its mask costs {llg_mask:.0f} µs a step (p95 {pct(llg.mask_us, 95):.0f}) "
        f"against outlines-core's {oc_mask:.0f} µs"
        f"{mask_why}; advancing past a token costs {statistics.median(llg.advance_us):.1f} µs against "
        f"{statistics.median(oc.advance_us):.1f} µs.",
        "",
        f"Coverage decides it: llguidance compiles and enforces {supported[llg.library]} of the "
        f"{len(features)} keywords, outlines-core {supported[oc.library]}"
        + (f" (llguidance alone: {', '.join(only_llg)})" if only_llg else "")
        + (f"; outlines-core alone: {', '.join(only_oc)}" if only_oc else "")
        + ". A keyword compiled but not enforced hands a client an answer its own schema rejects (or that is "
        "not JSON), where a refused one is an honest 400. "
        + (
            "Every llguidance walk's answer parsed and validated. "
            if all_valid
            else "Not every llguidance walk's answer validated (see the table). "
        )
        + "Both run without torch in the replica (a Rust extension and numpy); xgrammar is excluded: its "
        "wheel requires torch, transformers and triton.",
    ]


def report(tokens: Tokens, setup: dict[str, float], results: list[SchemaResult],
           features: dict[str, dict[str, FeatureResult]], args: argparse.Namespace) -> list[str]:  # fmt: skip
    names = [Llguidance.name, OutlinesCore.name]
    versions = f"llguidance {_version('llguidance')}, outlines-core {_version('outlines_core')}"
    samples = [
        f"- {r.library}: `{_short(r.sample, 200)}`" for r in results if r.sample and r.schema == NESTED
    ]
    return [
        f"On {cpu_description()} (flags: {cpu_flags()}); {load_average()} at the end. {versions}; the dev "
        f"model's tokenizer ({len(tokens.token_bytes):,} ordinary tokens, byte-level BPE). Built once per "
        f"tokenizer: llguidance's LLTokenizer in {setup[Llguidance.name]:.0f} ms, outlines-core's Vocabulary "
        f"in {setup[OutlinesCore.name]:.0f} ms.",
        "",
        f"Compile cold: the median of {args.repeats} compiles from the schema to its first mask "
        "(llguidance: JSON-schema grammar and LLMatcher; outlines-core: regex and Index). Cached start: "
        "llguidance's deep_copy of a compiled matcher, outlines-core's Guide over a built Index. Mask: the "
        f"library's bitmask as a boolean [vocab] array, per step, over at least {MIN_WALKS} walks and "
        f"{args.steps} steps (a walk takes, at each step, the allowed token that a seeded random logits "
        "vector ranks highest, closing characters favoured; both libraries get the same vectors). Advance: "
        "consume_token / advance past the chosen token. Walks valid: answers that parse and validate "
        "against the schema (jsonschema, formats checked).",
        "",
        *schema_table(results),
        "",
        "Each library's answer to the nested schema in walk 0 (llguidance lays JSON out as the engine asks, "
        "outlines-core was given no whitespace):",
        "",
        *samples,
        "",
        f'JSON-schema keywords, each in a small schema walked {FEATURE_WALKS} times ("yes": compiled and '
        'every answer valid; "wrong output": compiled, but an answer breaks the schema; "refused": the '
        "library's error):",
        "",
        *feature_table(features, names),
        "",
        "outlines-core unrolls a recursive $ref to a fixed depth (build_regex_from_schema's "
        "max_recursion_depth, 3 by default): deeper trees cannot be generated; llguidance's grammar is "
        "recursive.",
        "",
        *conclusion(results, features, tokens.vocab_size),
    ]


def _version(module: str) -> str:
    from importlib.metadata import version

    return version(module.replace("_", "-"))


def run(args: argparse.Namespace) -> list[str]:
    tokens = Tokens.load(args.model)
    setup: dict[str, float] = {}
    libraries: list[Library] = []
    for make in (Llguidance, OutlinesCore):
        began = time.perf_counter()
        libraries.append(make(tokens))
        setup[make.name] = (time.perf_counter() - began) * 1e3
    bonus = closing_bonus(tokens)
    results = [measure_schema(lib, name, schema, tokens, bonus, args)
               for name, schema in SCHEMAS.items() for lib in libraries]  # fmt: skip
    features = {keyword: {lib.name: measure_feature(lib, schema, tokens, bonus) for lib in libraries}
                for keyword, schema in FEATURES.items()}  # fmt: skip
    return report(tokens, setup, results, features, args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=Path(".sluice/models/sluice-tiny"),
                    help="a checkpoint directory with tokenizer.json and tokenizer_config.json")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=10, help="cold compiles per schema and library")
    ap.add_argument("--steps", type=int, default=200, help="decoding steps to time per schema and library")
    ap.add_argument("--max-walk-steps", type=int, default=1000, help="a walk that has not ended stops here")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    lines = run(args)
    print("\n".join(lines))
    if args.write_docs:
        command = f".venv/bin/python -m bench.grammar_choice --model {args.model} --write-docs"
        body = [
            TITLE,
            "",
            f"Measured {time.strftime('%Y-%m-%d')} with:",
            "",
            f"```\n{command}\n```",
            "",
            *lines,
        ]
        write_section(SECTION, "\n".join(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
