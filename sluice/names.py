"""The name rules, each written once (a registry, a Triton repository, a build and the gateway's settings
all check names against these).

- A **model name** as clients send it and the registry keeps it: OpenAI's names may hold "/" or ":"
  (``org/model``, ``model:tag``).
- A **Triton model name**: also a folder of the model repository, so neither "/" nor ":". A model Sluice
  renders, builds or serves from Triton is named by this rule (a subset of the first).
- An **S3 bucket** (S3's own rules), an **object key** (``/``-separated parts of safe characters), and
  the **files URL** ``s3://BUCKET/PREFIX`` made of them (``SLUICE_FILES_URL``).

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


# S3's bucket naming rules: 3-63 characters of lowercase letters, digits, '.' and '-', alphanumeric at both
# ends (MinIO and moto accept the same).
S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
OBJECT_KEY = re.compile(r"[A-Za-z0-9_.=-]+(/[A-Za-z0-9_.=-]+)*")
MAX_OBJECT_KEY_CHARS = 512


def s3_bucket_problem(bucket: str) -> str | None:
    if S3_BUCKET.fullmatch(bucket) and ".." not in bucket:
        return None
    return (
        f"{bucket!r} is not a valid S3 bucket name (3-63 lowercase letters, digits, '.' and '-', "
        "starting and ending with a letter or digit)"
    )


def is_object_key(key: str) -> bool:
    parts = key.split("/")
    safe = bool(OBJECT_KEY.fullmatch(key)) and "." not in parts and ".." not in parts
    return safe and len(key) <= MAX_OBJECT_KEY_CHARS


def parse_files_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` (the prefix may be empty or nested) as (bucket, prefix without slashes at
    its ends); ValueError saying what is wrong otherwise."""
    if not url.startswith("s3://"):
        raise ValueError(
            f"must be s3://BUCKET/PREFIX, or unset for files under the state directory; got {url!r}"
        )
    bucket, _sep, prefix = url[len("s3://") :].partition("/")
    if (problem := s3_bucket_problem(bucket)) is not None:
        raise ValueError(problem)
    prefix = prefix.strip("/")
    if prefix and not is_object_key(prefix):
        raise ValueError(
            f"prefix {prefix!r}: '/'-separated parts of letters, digits, '_', '.', '=' and '-' only"
        )
    return bucket, prefix
