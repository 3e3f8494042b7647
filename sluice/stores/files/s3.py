"""Files in an S3 bucket (or an S3-compatible server: MinIO, moto) under a prefix:
``SLUICE_FILES_URL=s3://BUCKET/PREFIX``, the endpoint from ``SLUICE_S3_ENDPOINT_URL`` (unset: AWS).

The client is the weight store's (``sluice.weight_store.s3.make_s3_client``: region and credentials from
boto3's default chain); its blocking calls run in a worker thread. botocore's errors stop here: a missing
object is ObjectNotFound, anything else (unreachable, 5xx, denied, no such bucket) ObjectStoreUnavailable
naming the bucket, key and S3's error code.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sluice.outages import OutageLog
from sluice.stores.files.base import ObjectNotFound, ObjectStore, ObjectStoreUnavailable, check_key, reported

T = TypeVar("T")
log = logging.getLogger(__name__)

_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
# S3's bucket naming rules (3-63 lowercase letters, digits, '.', '-'; alphanumeric at both ends).


class S3ObjectStore(ObjectStore):
    def __init__(
        self,
        bucket: str,
        prefix: str,
        endpoint_url: str | None = None,
        *,
        max_attempts: int = 3,
        list_page_keys: int = 1000,
    ) -> None:
        """``max_attempts``: tries per call before ObjectStoreUnavailable (botocore's standard retry mode:
        connection errors, 5xx and throttling, with jittered backoff), kept low because a client waits.
        ``list_page_keys``: keys per LIST response (S3's most is 1000; tests page with fewer)."""
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self._max_attempts = max_attempts
        self._list_page_keys = list_page_keys
        self._client: Any = None
        self._outage = OutageLog(log, f"file store s3://{self.bucket}/{self.prefix}")

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3ObjectStore(s3://{self.bucket}/{self.prefix}{where})"

    async def open(self) -> None:
        """Builds the client only: S3 is not reached, so a gateway starts while S3 is down (requests that
        need a file get 503 until it answers)."""
        from sluice.weight_store.s3 import make_s3_client

        self._client = await asyncio.to_thread(
            make_s3_client, endpoint_url=self.endpoint_url, max_attempts=self._max_attempts
        )

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def put(self, key: str, data: bytes) -> None:
        full_key = self._full_key(key)  # one PUT: S3 shows an object whole or not at all
        await self._call(
            f"PUT {key}", lambda: self._client.put_object(Bucket=self.bucket, Key=full_key, Body=data)
        )

    async def get(self, key: str) -> bytes:
        full_key = self._full_key(key)

        def read() -> bytes:
            response = self._client.get_object(Bucket=self.bucket, Key=full_key)
            return bytes(response["Body"].read())

        return await self._call(f"GET {key}", read, missing=key)

    async def copy(self, src_key: str, dst_key: str) -> None:
        full_src, full_dst = self._full_key(src_key), self._full_key(dst_key)
        # Server-side CopyObject: the bytes never leave S3 (one call up to 5 GiB, far over file_max_bytes).
        source = {"Bucket": self.bucket, "Key": full_src}
        await self._call(
            f"COPY {src_key} to {dst_key}",
            lambda: self._client.copy_object(Bucket=self.bucket, Key=full_dst, CopySource=source),
            missing=src_key,
        )

    async def delete(self, key: str) -> None:
        full_key = self._full_key(key)  # S3 answers 204 for a missing key too
        await self._call(
            f"DELETE {key}", lambda: self._client.delete_object(Bucket=self.bucket, Key=full_key)
        )

    async def list(self, prefix: str) -> list[str]:
        if prefix:
            check_key(prefix[:-1] if prefix.endswith("/") else prefix)
        full_prefix = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0  # the store's own prefix and its "/"

        def list_all() -> list[str]:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full_prefix, PaginationConfig={"PageSize": self._list_page_keys}
            )
            return sorted(item["Key"][strip:] for page in pages for item in page.get("Contents", []))

        return await self._call(f"LIST {prefix}", list_all)

    def _full_key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    async def _call(self, what: str, fn: Callable[[], T], missing: str | None = None) -> T:
        if self._client is None:
            raise RuntimeError(f"{self!r} is not open")
        return await reported(self._outage, asyncio.to_thread(self._translated, what, fn, missing))

    def _translated(self, what: str, fn: Callable[[], T], missing: str | None) -> T:
        with self._errors(what, missing):
            return fn()

    @contextmanager
    def _errors(self, what: str, missing: str | None) -> Iterator[None]:
        """botocore's errors as the interface's: ObjectNotFound(``missing``) for a missing object when
        ``missing`` is given, ObjectStoreUnavailable for everything else."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", "")) or "error"
            if missing is not None and code in _MISSING_CODES:
                raise ObjectNotFound(missing) from None
            raise ObjectStoreUnavailable(
                f"{what} in s3://{self.bucket}/{self.prefix}: {code}: {exc}"
            ) from exc
        except BotoCoreError as exc:  # unreachable, timed out, no credentials
            raise ObjectStoreUnavailable(f"{what} in s3://{self.bucket}/{self.prefix}: {exc}") from exc
