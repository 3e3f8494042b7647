"""The name rules, each written once (a registry, a Triton repository, a build and the gateway's settings
all check names against these).

- A **model name** as clients send it and the registry keeps it: OpenAI's names may hold "/" or ":"
  (``org/model``, ``model:tag``).
- A **Triton model name**: also a folder of the model repository, so neither "/" nor ":". A model Sluice
  renders, builds or serves from Triton is named by this rule (a subset of the first).

Each ``*_problem`` returns None for a good name, else a sentence saying the rule; callers raise their own
error type with it. Patterns are matched whole (``fullmatch``: "2\\n" is not a name).
"""

from __future__ import annotations

import re

MAX_MODEL_NAME_CHARS = 128
MODEL_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:/-]{{0,{MAX_MODEL_NAME_CHARS - 1}}}")
TRITON_MODEL_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_MODEL_NAME_CHARS - 1}}}")


def _problem(pattern: re.Pattern[str], rule: str, name: object) -> str | None:
    if isinstance(name, str) and pattern.fullmatch(name):
        return None
    return f"model name must match {pattern.pattern} ({rule}), got {name!r}"


def model_name_problem(name: object) -> str | None:
    return _problem(MODEL_NAME, "letters and digits, then also '.', '_', ':', '/' or '-'; 128 at most", name)


def triton_model_name_problem(name: object) -> str | None:
    rule = "letters and digits, then also '.', '_' or '-'; 128 at most: it is a folder of the repository"
    return _problem(TRITON_MODEL_NAME, rule, name)
