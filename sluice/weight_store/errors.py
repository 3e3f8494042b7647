"""The weight store's errors: every failure a caller may handle is one of these, never a botocore type."""

from __future__ import annotations


class WeightStoreError(Exception):
    """Base class: the message says what failed, naming the bucket/key or the local path."""


class InvalidUriError(WeightStoreError, ValueError):
    """A location is not ``s3://BUCKET/PREFIX`` (or the bucket or prefix is invalid)."""


class ManifestError(WeightStoreError, ValueError):
    """A manifest is malformed (bad JSON, a missing field, a bad path or digest, a wrong artifact digest)."""


class ManifestNotFoundError(WeightStoreError):
    """No ``manifest.json`` at the prefix: nothing was uploaded there, or the upload never finished."""


class IntegrityError(WeightStoreError):
    """A downloaded object's size or sha256 differs from its manifest entry; the bytes were discarded."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class StoreAccessError(WeightStoreError):
    """The object store refused or failed a request (no such bucket, denied, unreachable)."""


class CacheError(WeightStoreError):
    """The local cache could not be written or read (disk full, a bad SLUICE_WEIGHT_CACHE_DIR)."""
