"""``WeightStore``: the one object callers use (the engine-build pipeline, replicas and gateways at
start-up). It holds an S3 client, the local cache folder and the transfer sizes; its verbs are
``upload_dir``, ``read_manifest`` and ``fetch`` (``fetch_artifact`` for the detailed result).

    store = WeightStore.from_settings(get_settings())
    manifest = store.upload_dir(Path("out/engine"), "s3://weights/engines/m/3", {"build": {...}})
    folder = store.fetch("s3://weights/engines/m/3")                      # every file, verified
    tokenizer = store.fetch(uri, include=lambda p: p.startswith("tokenizer"))  # only these files

The client is any boto3 S3 client (or an object with its ``get_object``, ``head_object``,
``put_object`` and ``upload_file`` methods, e.g. a test's wrapper that breaks a download).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.weight_store.cache import ObjectCache
from sluice.weight_store.errors import CacheError
from sluice.weight_store.fetch import fetch_files
from sluice.weight_store.manifest import Manifest
from sluice.weight_store.s3 import get_bytes, make_s3_client
from sluice.weight_store.upload import upload_dir
from sluice.weight_store.uri import S3Uri, parse_s3_uri

if TYPE_CHECKING:
    from sluice.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_PART_SIZE_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_CONCURRENCY = 8


@dataclass(frozen=True)
class FetchResult:
    """What ``fetch_artifact`` did. ``path`` is the artifact's folder in the cache (files by relative
    path); ``num_downloaded_files == 0`` means everything came from the cache."""

    path: Path
    manifest: Manifest
    num_files: int  # the files asked for (all, or those include accepted)
    num_downloaded_files: int
    downloaded_bytes: int
    num_resumed_files: int  # files that continued a partial download instead of starting over


class WeightStore:
    """Uploads artifacts with a manifest and fetches them, verified, into a content-addressed cache.

    ``part_size_bytes``: a download is split into ranged GETs of this size (uploads use multipart parts
    of at least 5 MiB, S3's minimum). ``max_concurrency``: requests in flight at once per call (parts of
    several files). ``quiet``: no progress line on stderr (there is none anyway when stderr is no TTY).
    """

    def __init__(
        self,
        client: Any,
        cache_dir: Path,
        *,
        part_size_bytes: int = DEFAULT_PART_SIZE_BYTES,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        quiet: bool = False,
    ) -> None:
        if part_size_bytes < 1:
            raise ValueError(f"part_size_bytes must be >= 1, got {part_size_bytes}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.client = client
        self.cache_dir = Path(cache_dir)
        self.part_size_bytes = part_size_bytes
        self.max_concurrency = max_concurrency
        self.quiet = quiet

    @classmethod
    def from_settings(cls, settings: Settings, *, quiet: bool = False) -> WeightStore:
        """A store on ``SLUICE_S3_ENDPOINT_URL`` (unset: AWS), with region and credentials from boto3's
        usual chain (AWS_* variables, ~/.aws, instance roles), caching under ``SLUICE_WEIGHT_CACHE_DIR``."""
        client = make_s3_client(
            endpoint_url=settings.s3_endpoint_url, max_pool_connections=settings.weight_store_max_concurrency
        )
        return cls(
            client,
            settings.weight_cache_dir,
            part_size_bytes=settings.weight_store_part_size_bytes,
            max_concurrency=settings.weight_store_max_concurrency,
            quiet=quiet,
        )

    def upload_dir(
        self, local_dir: Path, uri: str | S3Uri, metadata: Mapping[str, Any] | None = None
    ) -> Manifest:
        """Upload every file under ``local_dir`` to ``uri`` (multipart for big files, several at once),
        then its manifest LAST, and return the manifest. If the prefix already holds an equal manifest
        (same files and metadata) and every object at its size, nothing is uploaded (logged); otherwise
        the prefix is overwritten.
        Raises FileNotFoundError, ManifestError (an empty folder, a top-level manifest.json) and
        StoreAccessError."""
        return upload_dir(
            self.client,
            Path(local_dir),
            _as_uri(uri),
            metadata,
            part_size_bytes=self.part_size_bytes,
            max_concurrency=self.max_concurrency,
            quiet=self.quiet,
        )

    def read_manifest(self, uri: str | S3Uri) -> Manifest:
        """The manifest at ``uri``: ManifestNotFoundError when there is none (nothing uploaded, or an
        upload that did not finish), ManifestError when it is malformed, StoreAccessError otherwise."""
        target = _as_uri(uri)
        body = get_bytes(self.client, target.bucket, target.manifest_key, missing_is_manifest=True)
        return Manifest.from_json(body, source=f"s3://{target.bucket}/{target.manifest_key}")

    def fetch(self, uri: str | S3Uri, *, include: Callable[[str], bool] | None = None) -> Path:
        """The artifact's folder in the local cache, every listed file (or every file ``include(path)``
        accepts) present and verified. See ``fetch_artifact``."""
        return self.fetch_artifact(uri, include=include).path

    def fetch_artifact(
        self, uri: str | S3Uri, *, include: Callable[[str], bool] | None = None
    ) -> FetchResult:
        """Download what the cache lacks with parallel ranged GETs, verify each file's size and sha256,
        and return the folder ``<cache>/artifacts/<artifact digest hex>/``.

        Files already in the cache (by sha256) are not downloaded again; an interrupted download resumes
        from the parts it had finished; two fetches of one artifact on one node (threads or processes)
        share the work through per-object lock files. A file whose bytes do not match raises
        IntegrityError naming its key and leaves nothing of it in the cache. Files in the folder are
        hard links to read-only cache objects: do not write to them. A local disk failure (full, not
        writable) raises CacheError."""
        target = _as_uri(uri)
        manifest = self.read_manifest(target)
        try:
            wanted, outcomes = fetch_files(
                self.client,
                target,
                manifest,
                ObjectCache(self.cache_dir),
                include=include,
                part_size_bytes=self.part_size_bytes,
                max_concurrency=self.max_concurrency,
                quiet=self.quiet,
            )
        except OSError as exc:
            raise CacheError(f"{target}: the weight cache at {self.cache_dir} failed: {exc}") from exc
        downloads = [o for o in outcomes if o.downloaded]
        result = FetchResult(
            path=ObjectCache(self.cache_dir).view_dir(manifest.artifact_digest),
            manifest=manifest,
            num_files=len(wanted),
            num_downloaded_files=len(downloads),
            downloaded_bytes=sum(o.downloaded_bytes for o in downloads),
            num_resumed_files=sum(o.resumed for o in downloads),
        )
        if not downloads:
            log.info("%s: all %d files already in the cache, nothing downloaded", target, len(wanted))
        else:
            log.info(
                "%s: downloaded %d of %d files (%d bytes, %d resumed) into %s",
                target,
                result.num_downloaded_files,
                result.num_files,
                result.downloaded_bytes,
                result.num_resumed_files,
                result.path,
            )
        return result


def _as_uri(uri: str | S3Uri) -> S3Uri:
    return uri if isinstance(uri, S3Uri) else parse_s3_uri(uri)


__all__ = ["FetchResult", "WeightStore"]
