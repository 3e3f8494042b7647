"""The S3 client and the one translation of its errors into the weight store's own."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sluice.weight_store.errors import ManifestNotFoundError, StoreAccessError

_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}


def make_s3_client(
    *, endpoint_url: str | None = None, max_pool_connections: int = 10, max_attempts: int = 5
) -> Any:
    """A boto3 S3 client: ``endpoint_url`` for an S3-compatible server (MinIO, moto), path-style
    addressing there; region and credentials from boto3's default chain; standard retries, each call
    tried at most ``max_attempts`` times (fewer on a request path, where a client waits)."""
    import boto3
    from botocore.config import Config

    config = Config(
        max_pool_connections=max(10, max_pool_connections + 2),
        retries={"mode": "standard", "max_attempts": max_attempts},
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


@contextmanager
def store_errors(what: str, *, missing_is_manifest: bool = False) -> Iterator[None]:
    """Turn botocore errors raised inside into StoreAccessError (or ManifestNotFoundError for a missing
    manifest) whose message starts with ``what`` (e.g. ``GET s3://b/k``)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if missing_is_manifest and code in _MISSING_CODES:
            raise ManifestNotFoundError(
                f"{what}: no manifest there; nothing was uploaded to this prefix or the upload did not "
                "finish (the manifest is written last)"
            ) from None
        raise StoreAccessError(f"{what}: {code or 'error'}: {exc}") from exc
    except BotoCoreError as exc:
        raise StoreAccessError(f"{what}: {exc}") from exc


def get_bytes(client: Any, bucket: str, key: str, *, missing_is_manifest: bool = False) -> bytes:
    """The whole object's bytes (small objects only: the manifest)."""
    with store_errors(f"GET s3://{bucket}/{key}", missing_is_manifest=missing_is_manifest):
        response = client.get_object(Bucket=bucket, Key=key)
        return bytes(response["Body"].read())


def object_size(client: Any, bucket: str, key: str) -> int | None:
    """The object's size in bytes (a HEAD), or None when there is no such object."""
    from botocore.exceptions import ClientError

    with store_errors(f"HEAD s3://{bucket}/{key}"):
        try:
            return int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) in _MISSING_CODES:
                return None
            raise
