"""The weight store: artifacts (checkpoints, engines) in S3-compatible object storage under
``s3://BUCKET/PREFIX`` with a sha256 manifest, fetched into a verified, content-addressed local cache
with parallel, resumable ranged downloads. See ``store.WeightStore`` and docs/operations.md."""

from sluice.weight_store.errors import (
    CacheError,
    IntegrityError,
    InvalidUriError,
    ManifestError,
    ManifestNotFoundError,
    StoreAccessError,
    WeightStoreError,
)
from sluice.weight_store.manifest import Manifest, ManifestEntry, compute_artifact_digest, manifest_for_dir
from sluice.weight_store.s3 import make_s3_client
from sluice.weight_store.store import FetchResult, WeightStore
from sluice.weight_store.uri import MANIFEST_NAME, S3Uri, parse_s3_uri

__all__ = [
    "MANIFEST_NAME",
    "CacheError",
    "FetchResult",
    "IntegrityError",
    "InvalidUriError",
    "Manifest",
    "ManifestEntry",
    "ManifestError",
    "ManifestNotFoundError",
    "S3Uri",
    "StoreAccessError",
    "WeightStore",
    "WeightStoreError",
    "compute_artifact_digest",
    "make_s3_client",
    "manifest_for_dir",
    "parse_s3_uri",
]
