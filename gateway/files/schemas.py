"""The Files API's wire types, as OpenAI's (the official client parses them unmodified)."""

from __future__ import annotations

from typing import Literal

import msgspec
from litestar.datastructures import UploadFile

from sluice.stores.files.catalog import StoredFile


class FileUpload(msgspec.Struct):
    """POST /v1/files's multipart form: the file (a ``.jsonl`` name, UTF-8 JSON lines), its purpose, and
    optionally when it expires (``gateway.files.retention``: form text, checked there)."""

    file: UploadFile
    purpose: str
    expires_after_anchor: str | None = msgspec.field(default=None, name="expires_after[anchor]")
    expires_after_seconds: str | None = msgspec.field(default=None, name="expires_after[seconds]")


class FileObject(msgspec.Struct):
    id: str
    bytes: int
    created_at: int  # unix seconds
    filename: str
    purpose: str
    object: Literal["file"] = "file"
    status: Literal["processed"] = "processed"  # stored whole before the response: nothing to process
    expires_at: int | None = None  # unix seconds; None: never (no expires_after at upload)
    status_details: str | None = None

    @classmethod
    def of(cls, stored: StoredFile) -> FileObject:
        return cls(
            id=stored.file_id,
            bytes=stored.num_bytes,
            created_at=int(stored.created_at.timestamp()),
            filename=stored.filename,
            purpose=stored.purpose,
            expires_at=None if stored.expires_at is None else int(stored.expires_at.timestamp()),
        )


class FileList(msgspec.Struct):
    data: list[FileObject]
    has_more: bool
    first_id: str | None
    last_id: str | None
    object: Literal["list"] = "list"


class FileDeleted(msgspec.Struct):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True
