"""Tenants' files (OpenAI's Files API) on top of an object store: each file's bytes and its metadata.

Layout, one prefix per tenant::

    files/<tenant_id>/<file_id>        the content, written first
    files/<tenant_id>/<file_id>.json   the metadata, written last: a file exists once its metadata does

A tenant reaches only keys under its own prefix, so no id, however crafted, names another tenant's file;
an id that is not ``file-<hex>`` is simply unknown. Deleting removes the metadata first (the file is gone)
and then the content. Nothing here logs file text.

A file may expire (``expires_at``, OpenAI's ``expires_after``): from that instant it is unknown to every
read, as a deleted one is, though its objects stay until ``sweep_expired`` deletes them (each gateway
sweeps periodically; two sweeps at once delete the same objects, which is no error). Metadata written
before files could expire has no ``expires_at``: such a file never expires.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sluice.stores.files.base import ObjectNotFound, ObjectStore
from sluice.stores.tenants.base import check_tenant_id

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
    expires_at: datetime | None = None  # aware, UTC; None: never

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now


class UnknownFileError(LookupError):
    """No such file for this tenant (never created, deleted, another tenant's, or not a file id)."""


class FileCatalog:
    """Every method may raise the store's ObjectStoreUnavailable (retry later)."""

    def __init__(self, store: ObjectStore, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        """``clock``: now, aware (tests pass their own to see files expire)."""
        self.store = store
        self._clock = clock

    async def create(
        self,
        tenant_id: str,
        filename: str,
        purpose: str,
        data: bytes,
        *,
        file_id: str | None = None,
        expires_after_s: int | None = None,
    ) -> StoredFile:
        """Store ``data`` as a new file; ValueError for an unknown purpose, an empty filename, a
        ``file_id`` that is not one or an ``expires_after_s`` under 1. ``file_id``: the id to store it
        under (a writer that may write the same file again after a crash names it, so the second write
        replaces the first rather than leaving an orphan); else a random one. ``expires_after_s``: the
        file expires that long after its creation; None: never."""
        check_tenant_id(tenant_id)
        if expires_after_s is not None and expires_after_s < 1:
            raise ValueError(f"expires_after_s must be at least 1, got {expires_after_s}")
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
            created_at=(now := self._clock()),
            expires_at=None if expires_after_s is None else now + timedelta(seconds=expires_after_s),
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
        stored = _decode(raw, tenant_id)
        if stored.expired(self._clock()):  # gone for every read, though the sweep has not deleted it yet
            raise UnknownFileError(file_id)
        return stored

    async def content(self, tenant_id: str, file_id: str) -> bytes:
        await self.get(tenant_id, file_id)  # a file exists once its metadata does
        try:
            return await self.store.get(_content_key(tenant_id, file_id))
        except ObjectNotFound:  # deleted meanwhile
            raise UnknownFileError(file_id) from None

    async def copy_content(self, tenant_id: str, file_id: str, dst_key: str) -> None:
        """Copy the file's content to ``dst_key`` of the store (no catalog file: the caller's own object,
        which outlives the file's deletion or expiry). UnknownFileError as ``get``."""
        await self.get(tenant_id, file_id)
        try:
            await self.store.copy(_content_key(tenant_id, file_id), dst_key)
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
        now = self._clock()
        files = [
            found
            for found in await self._read_all(f"files/{tenant_id}/")
            if not found.expired(now) and (purpose is None or found.purpose == purpose)
        ]
        files.sort(key=lambda f: (f.created_at, f.file_id), reverse=True)
        return files

    async def sweep_expired(self) -> builtins.list[StoredFile]:
        """Delete every tenant's expired files (metadata first, as ``delete``); returns those deleted.
        Safe to run on several gateways at once: a file another sweep deleted first is deleted again, as
        a no-op (and may be returned by both)."""
        now = self._clock()
        expired = [found for found in await self._read_all("files/") if found.expired(now)]
        for stored in expired:
            await self.store.delete(_metadata_key(stored.tenant_id, stored.file_id))
            await self.store.delete(_content_key(stored.tenant_id, stored.file_id))
        return expired

    async def _read_all(self, prefix: str) -> builtins.list[StoredFile]:
        """The metadata of every file under ``prefix`` (one tenant's folder, or ``files/`` for all)."""
        keys = [key for key in await self.store.list(prefix) if _tenant_of_metadata_key(key) is not None]
        files: builtins.list[StoredFile] = []
        for start in range(0, len(keys), _MAX_CONCURRENT_READS):  # S3: a round trip each, so a few at once
            chunk = keys[start : start + _MAX_CONCURRENT_READS]
            files.extend(found for found in await asyncio.gather(*map(self._read_metadata, chunk)) if found)
        return files

    async def _read_metadata(self, key: str) -> StoredFile | None:
        tenant_id = _tenant_of_metadata_key(key)
        try:
            return _decode(await self.store.get(key), str(tenant_id))
        except (ObjectNotFound, UnknownFileError):  # deleted since the listing; another tenant's
            return None


def _tenant_of_metadata_key(key: str) -> str | None:
    """The tenant of a metadata key (``files/<tenant_id>/<file_id>.json``); None for any other key."""
    parts = key.split("/")
    if len(parts) != 3 or parts[0] != "files" or not parts[2].endswith(_METADATA_SUFFIX):
        return None
    return parts[1] if _FILE_ID.fullmatch(parts[2].removesuffix(_METADATA_SUFFIX)) else None


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
            "expires_at": None if stored.expires_at is None else stored.expires_at.isoformat(),
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
        expires_at=_utc_or_none(fields.get("expires_at")),  # absent in metadata written before expiry
    )
    # NOTE: the key already scopes it to the tenant; this only catches a store written by hand.
    if stored.tenant_id != tenant_id:
        raise UnknownFileError(stored.file_id)
    return stored


def _utc_or_none(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text).astimezone(UTC)
