"""The Files API's wire types, as OpenAI's (the official client parses them unmodified)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec
from litestar.datastructures import UploadFile

from sluice.files.catalog import StoredFile


@dataclass
class FileUpload:
    """POST /v1/files's multipart form: the file (a ``.jsonl`` name, UTF-8 JSON lines) and its purpose."""

    file: UploadFile
    purpose: str


class FileObject(msgspec.Struct):
    id: str
    bytes: int
    created_at: int  # unix seconds
    filename: str
    purpose: str
    object: Literal["file"] = "file"
    status: Literal["processed"] = "processed"  # stored whole before the response: nothing to process
    expires_at: int | None = None  # files do not expire
    status_details: str | None = None

    @classmethod
    def of(cls, stored: StoredFile) -> FileObject:
        return cls(
            id=stored.file_id,
            bytes=stored.num_bytes,
            created_at=int(stored.created_at.timestamp()),
            filename=stored.filename,
            purpose=stored.purpose,
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
