"""The safety configuration: block list, named regular expressions, PII switches and named policies,
from an optional JSON file (``SLUICE_SAFETY_CONFIG``), validated once at start.

    {
      "blocklist": ["forbidden phrase", "another"],
      "regexes": [{"name": "ticket", "pattern": "\\\\bTCK-\\\\d{4,8}\\\\b", "max_match_chars": 12}],
      "regex_max_match_chars": 64,
      "pii": {"email": true, "card": true, "ssn": false},
      "policies": {"pii-only": {"input": ["pii"], "output": ["pii"]}}
    }

Every field is optional. ``regex_max_match_chars`` is the bound assumed for a regex without its own
``max_match_chars``: the streaming holdback is sized from it (a regex cannot be measured in general), and
text a longer match covers may start before the holdback and reach the client. Classifier names in a
policy: ``rules`` (block list + regexes + PII), ``content`` (block list + regexes), ``blocklist``,
``regexes``, ``pii``, ``triton`` (the Triton-served classifier; input only: it is too slow to screen
every streamed chunk).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ClassifierRef = Literal["rules", "content", "blocklist", "regexes", "pii", "triton"]
BUILTIN_POLICY_NAMES = ("none", "default", "pii", "strict")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")


class SafetyConfigError(ValueError):
    """The safety configuration is wrong; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegexRuleConfig(_Strict):
    name: str  # the verdict's category is "regex:<name>"
    pattern: str  # Python ``re`` syntax, compiled as given (add (?i) for case-insensitive)
    max_match_chars: int | None = Field(default=None, ge=1, le=4096)  # None: regex_max_match_chars

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):
            raise ValueError(f"must match {_NAME.pattern}")
        return v

    @field_validator("pattern")
    @classmethod
    def _check_pattern(cls, v: str) -> str:
        try:
            compiled = re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        if compiled.fullmatch("") is not None:
            raise ValueError("matches the empty string, so it would block everything")
        return v


class PiiConfig(_Strict):
    email: bool = True
    card: bool = True  # 13-19 digits, spaces or dashes between, confirmed by the Luhn check
    ssn: bool = False  # US social security numbers written NNN-NN-NNNN


class PolicySpec(_Strict):
    input: tuple[ClassifierRef, ...] = ()
    output: tuple[ClassifierRef, ...] = ()

    @field_validator("output")
    @classmethod
    def _check_output(cls, v: tuple[ClassifierRef, ...]) -> tuple[ClassifierRef, ...]:
        if "triton" in v:
            raise ValueError("the triton classifier screens input only (too slow for every streamed chunk)")
        return v


class SafetyConfig(_Strict):
    blocklist: tuple[str, ...] = ()  # whole words or phrases, case-insensitive
    regexes: tuple[RegexRuleConfig, ...] = ()
    regex_max_match_chars: int = Field(default=64, ge=1, le=4096)
    pii: PiiConfig = PiiConfig()
    policies: dict[str, PolicySpec] = Field(default_factory=dict)  # besides none, default, pii, strict

    @field_validator("blocklist")
    @classmethod
    def _check_blocklist(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for phrase in v:
            if not phrase.split():
                raise ValueError(f"entries must hold at least one word, got {phrase!r}")
            if len(phrase) > 256:  # rules.MAX_PHRASE_CHARS
                raise ValueError(f"entries must be at most 256 characters, got {len(phrase)}")
        return v

    @model_validator(mode="after")
    def _check_names(self) -> SafetyConfig:
        names = [r.name for r in self.regexes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"regex names must be unique; repeated: {', '.join(duplicates)}")
        for name in self.policies:
            if name in BUILTIN_POLICY_NAMES:
                raise ValueError(f"policy {name!r} is built in and cannot be redefined; pick another name")
            if not _NAME.fullmatch(name):
                raise ValueError(f"policy name {name!r} must match {_NAME.pattern}")
        return self


def policy_names(config: SafetyConfig) -> list[str]:
    """Every policy a tenant may name under this configuration: the built-in ones, then the config's."""
    return [*BUILTIN_POLICY_NAMES, *sorted(config.policies)]


def load_safety_config(path: Path | None) -> SafetyConfig:
    """The configuration in ``path`` (JSON), or the defaults (PII rules only) when None."""
    if path is None:
        return SafetyConfig()
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise SafetyConfigError(f"cannot read the safety config {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SafetyConfigError(f"the safety config {path} is not valid JSON: {exc}") from None
    return parse_safety_config(data, source=str(path))


def parse_safety_config(data: object, source: str = "the safety config") -> SafetyConfig:
    try:
        return SafetyConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            problems.append(f"{where}: {err['msg']}")
        raise SafetyConfigError(f"invalid {source}:\n  " + "\n  ".join(problems)) from None
