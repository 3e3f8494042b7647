"""Tenants' files (OpenAI's Files API) on top of an object store: each file's bytes and its metadata.

Layout, one prefix per tenant::

    files/<tenant_id>/<file_id>        the content, written first
    files/<tenant_id>/<file_id>.json   the metadata, written last: a file exists once its metadata does

A tenant reaches only keys under its own prefix, so no id, however crafted, names another tenant's file;
an id that is not ``file-<hex>`` is simply unknown. Deleting removes the metadata first (the file is gone)
and then the content. Nothing here logs file text.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from sluice.files.base import ObjectNotFound, ObjectStore
from sluice.tenants.base import check_tenant_id

PURPOSES = frozenset({"batch", "batch_output"})  # uploads; results the batch runner writes
_FILE_ID = re.compile(r"^file-[0-9a-f]{24,64}$")
_METADATA_SUFFIX = ".json"
_MAX_CONCURRENT_READS = 16  # metadata reads in flight while listing


@dataclass(frozen=True)
class StoredFile:
    file_id: str  # "file-<24+ hex>"
    tenant_id: str
    filename: str
    purpose: str  # "batch" (uploads) or "batch_output" (results the batch runner writes)
    num_bytes: int
    created_at: datetime  # aware, UTC


class UnknownFileError(LookupError):
    """No such file for this tenant (never created, deleted, another tenant's, or not a file id)."""


class FileCatalog:
    """Every method may raise the store's ObjectStoreUnavailable (retry later)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def create(
        self, tenant_id: str, filename: str, purpose: str, data: bytes, *, file_id: str | None = None
    ) -> StoredFile:
        """Store ``data`` as a new file; ValueError for an unknown purpose, an empty filename or a
        ``file_id`` that is not one. ``file_id``: the id to store it under (a writer that may write the
        same file again after a crash names it, so the second write replaces the first rather than
        leaving an orphan); else a random one."""
        check_tenant_id(tenant_id)
        if purpose not in PURPOSES:
            raise ValueError(f"purpose must be one of {sorted(PURPOSES)}, got {purpose!r}")
        if not filename:
            raise ValueError("a file needs a name")
        if file_id is not None and not _FILE_ID.fullmatch(file_id):
            raise ValueError(f"not a file id: {file_id!r}")
        stored = StoredFile(
            file_id=file_id or f"file-{secrets.token_hex(12)}",
            tenant_id=tenant_id,
            filename=filename,
            purpose=purpose,
            num_bytes=len(data),
            created_at=datetime.now(UTC),
        )
        await self.store.put(_content_key(tenant_id, stored.file_id), data)
        await self.store.put(_metadata_key(tenant_id, stored.file_id), _encode(stored))
        return stored

    async def get(self, tenant_id: str, file_id: str) -> StoredFile:
        check_tenant_id(tenant_id)
        if not _FILE_ID.fullmatch(file_id):
            raise UnknownFileError(file_id)
        try:
            raw = await self.store.get(_metadata_key(tenant_id, file_id))
        except ObjectNotFound:
            raise UnknownFileError(file_id) from None
        return _decode(raw, tenant_id)

    async def content(self, tenant_id: str, file_id: str) -> bytes:
        await self.get(tenant_id, file_id)  # a file exists once its metadata does
        try:
            return await self.store.get(_content_key(tenant_id, file_id))
        except ObjectNotFound:  # deleted meanwhile
            raise UnknownFileError(file_id) from None

    async def delete(self, tenant_id: str, file_id: str) -> StoredFile:
        stored = await self.get(tenant_id, file_id)
        await self.store.delete(_metadata_key(tenant_id, file_id))
        await self.store.delete(_content_key(tenant_id, file_id))
        return stored

    async def list(self, tenant_id: str, purpose: str | None = None) -> list[StoredFile]:
        """This tenant's files, newest first (``purpose``: only those). One read per file's metadata."""
        check_tenant_id(tenant_id)
        keys = [
            key
            for key in await self.store.list(f"files/{tenant_id}/")
            if key.endswith(_METADATA_SUFFIX)
            and _FILE_ID.fullmatch(key.rsplit("/", 1)[1].removesuffix(_METADATA_SUFFIX))
        ]
        files: list[StoredFile] = []
        for start in range(0, len(keys), _MAX_CONCURRENT_READS):  # S3: a round trip each, so a few at once
            chunk = keys[start : start + _MAX_CONCURRENT_READS]
            for found in await asyncio.gather(*(self._read_metadata(key, tenant_id) for key in chunk)):
                if found is not None and (purpose is None or found.purpose == purpose):
                    files.append(found)
        files.sort(key=lambda f: (f.created_at, f.file_id), reverse=True)
        return files

    async def _read_metadata(self, key: str, tenant_id: str) -> StoredFile | None:
        try:
            return _decode(await self.store.get(key), tenant_id)
        except (ObjectNotFound, UnknownFileError):  # deleted since the listing; another tenant's
            return None


def _content_key(tenant_id: str, file_id: str) -> str:
    return f"files/{tenant_id}/{file_id}"


def _metadata_key(tenant_id: str, file_id: str) -> str:
    return f"files/{tenant_id}/{file_id}{_METADATA_SUFFIX}"


def _encode(stored: StoredFile) -> bytes:
    return json.dumps(
        {
            "file_id": stored.file_id,
            "tenant_id": stored.tenant_id,
            "filename": stored.filename,
            "purpose": stored.purpose,
            "num_bytes": stored.num_bytes,
            "created_at": stored.created_at.isoformat(),
        }
    ).encode()


def _decode(raw: bytes, tenant_id: str) -> StoredFile:
    fields = json.loads(raw)
    stored = StoredFile(
        file_id=str(fields["file_id"]),
        tenant_id=str(fields["tenant_id"]),
        filename=str(fields["filename"]),
        purpose=str(fields["purpose"]),
        num_bytes=int(fields["num_bytes"]),
        created_at=datetime.fromisoformat(fields["created_at"]).astimezone(UTC),
    )
    # NOTE: the key already scopes it to the tenant; this only catches a store written by hand.
    if stored.tenant_id != tenant_id:
        raise UnknownFileError(stored.file_id)
    return stored
