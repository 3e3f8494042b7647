"""Which object store holds files, chosen once from settings: ``files_url`` unset, a directory under the
state directory (``<state_dir>/files``); ``s3://BUCKET/PREFIX``, that bucket (endpoint
``s3_endpoint_url``)."""

from __future__ import annotations

import logging

from sluice.files.base import ObjectStore
from sluice.files.local import LocalObjectStore
from sluice.files.s3 import S3ObjectStore, parse_files_url
from sluice.settings import Settings

log = logging.getLogger(__name__)


async def open_object_store(settings: Settings) -> ObjectStore:
    """An opened object store; the caller closes it. An unreachable S3 does not fail the start: file
    requests get 503 until it answers."""
    store: ObjectStore
    if settings.files_url is None:
        store = LocalObjectStore(settings.state_dir / "files")
        log.info("files: in the directory %s", store.root)
    else:
        bucket, prefix = parse_files_url(settings.files_url)
        store = S3ObjectStore(bucket, prefix, endpoint_url=settings.s3_endpoint_url)
        log.info("files: in s3://%s/%s (endpoint %s)", bucket, prefix, settings.s3_endpoint_url or "AWS")
    await store.open()
    return store
