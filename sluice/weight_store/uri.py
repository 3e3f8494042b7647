"""``s3://BUCKET/PREFIX``: where one artifact (a checkpoint, an engine) lives in the weight store.

Every file of the artifact is the object ``PREFIX/<relative path>``; its manifest is ``PREFIX/manifest.json``.
A prefix is required (an artifact owns a folder, never a whole bucket); a trailing ``/`` is dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.names import s3_bucket_problem
from sluice.weight_store.errors import InvalidUriError

MANIFEST_NAME = "manifest.json"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class S3Uri:
    """A bucket and a prefix without leading or trailing ``/`` (e.g. ``engines/sluice-tiny/3``)."""

    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def manifest_key(self) -> str:
        return f"{self.prefix}/{MANIFEST_NAME}"

    def key(self, relative_path: str) -> str:
        """The object key of the artifact's file at ``relative_path`` (POSIX, relative)."""
        return f"{self.prefix}/{relative_path}"

    def child(self, sub_prefix: str) -> S3Uri:
        """The URI of a folder below this one: ``s3://b/engines`` + ``m/3`` -> ``s3://b/engines/m/3``."""
        return parse_s3_uri(f"{self}/{sub_prefix}")


def parse_s3_uri(text: str) -> S3Uri:
    """``s3://BUCKET/PREFIX`` parsed, or InvalidUriError saying what is wrong with it."""
    if not isinstance(text, str) or not text.startswith("s3://"):
        raise InvalidUriError(f"a weight store location reads s3://BUCKET/PREFIX, got {text!r}")
    bucket, sep, prefix = text[len("s3://") :].partition("/")
    if (problem := s3_bucket_problem(bucket)) is not None:
        raise InvalidUriError(f"{text!r}: {problem}")
    prefix = prefix.rstrip("/")
    if not sep or not prefix:
        raise InvalidUriError(
            f"{text!r} names a bucket but no prefix: an artifact lives in a folder, s3://{bucket}/PREFIX"
        )
    segments = prefix.split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        raise InvalidUriError(f"{text!r}: the prefix may not hold empty, '.' or '..' path segments")
    if _CONTROL.search(prefix):
        raise InvalidUriError(f"{text!r}: the prefix may not hold control characters")
    if len(prefix.encode()) > 900:
        raise InvalidUriError(f"{text!r}: the prefix is too long for S3 keys (at most 900 bytes)")
    return S3Uri(bucket=bucket, prefix=prefix)
