"""Upload a local folder as an artifact: every file (multipart above the part size, several files at
once), then ``manifest.json`` last, so a prefix with a manifest always holds every file it lists."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sluice.weight_store.errors import ManifestError, ManifestNotFoundError
from sluice.weight_store.manifest import Manifest, manifest_for_dir
from sluice.weight_store.progress import Progress
from sluice.weight_store.s3 import get_bytes, object_size, store_errors
from sluice.weight_store.uri import S3Uri

log = logging.getLogger(__name__)

# S3 refuses multipart parts under 5 MiB (except the last); MinIO and moto enforce the same.
_MIN_MULTIPART_BYTES = 5 * 1024 * 1024


def upload_dir(
    client: Any,
    local_dir: Path,
    uri: S3Uri,
    metadata: Mapping[str, Any] | None,
    *,
    part_size_bytes: int,
    max_concurrency: int,
    quiet: bool,
) -> Manifest:
    """See ``WeightStore.upload_dir``."""
    from boto3.s3.transfer import TransferConfig

    manifest = manifest_for_dir(local_dir, metadata)
    if _already_uploaded(client, uri, manifest):
        log.info(
            "%s already holds these files and metadata (%s): nothing uploaded", uri, manifest.artifact_digest
        )
        return manifest
    chunk_bytes = max(part_size_bytes, _MIN_MULTIPART_BYTES)
    # Parts of one file in parallel, and a few files at once; together about max_concurrency requests.
    num_file_workers = max(1, min(4, max_concurrency, len(manifest.files)))
    transfer = TransferConfig(
        multipart_threshold=chunk_bytes,
        multipart_chunksize=chunk_bytes,
        max_concurrency=max(1, max_concurrency // num_file_workers),
        use_threads=True,
    )
    progress = Progress(f"upload {uri}", manifest.total_bytes, quiet=quiet)

    def put(relative_path: str) -> None:
        key = uri.key(relative_path)
        with store_errors(f"PUT s3://{uri.bucket}/{key}"):
            client.upload_file(
                str(local_dir / relative_path), uri.bucket, key, Config=transfer, Callback=progress.add
            )

    with ThreadPoolExecutor(num_file_workers, thread_name_prefix="weight-upload") as pool:
        for future in [pool.submit(put, e.path) for e in manifest.files]:
            future.result()
    progress.close()
    with store_errors(f"PUT s3://{uri.bucket}/{uri.manifest_key}"):
        client.put_object(
            Bucket=uri.bucket,
            Key=uri.manifest_key,
            Body=manifest.to_json().encode(),
            ContentType="application/json",
        )
    log.info(
        "uploaded %d files (%d bytes) to %s, artifact %s",
        len(manifest.files),
        manifest.total_bytes,
        uri,
        manifest.artifact_digest,
    )
    return manifest


def _already_uploaded(client: Any, uri: S3Uri, manifest: Manifest) -> bool:
    """Whether ``uri`` holds an equal manifest and every object it lists at its size (a HEAD each; an
    object changed at the same size is caught by the sha256 check of whoever fetches it)."""
    try:
        body = get_bytes(client, uri.bucket, uri.manifest_key, missing_is_manifest=True)
        if Manifest.from_json(body) != manifest:
            return False
    except (ManifestNotFoundError, ManifestError):
        return False
    return all(object_size(client, uri.bucket, uri.key(e.path)) == e.size_bytes for e in manifest.files)
