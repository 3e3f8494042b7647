"""OpenAI's Files API for the caller's tenant: upload a batch input file, list, retrieve, download, delete.

Uploads are ``multipart/form-data`` (``file``, ``purpose``, optionally ``expires_after[anchor]`` and
``expires_after[seconds]``: the file expires that long after its upload, ``gateway.files.retention``), as
OpenAI takes them; an expired file is unknown (404) at once, and a sweep (``gateway.files.sweeper``)
deletes it later. Only purpose ``batch``
may be uploaded (``batch_output`` files are the batch runner's results); the file must be non-empty, at
most ``file_max_bytes``, named ``*.jsonl`` and UTF-8. Its lines are not checked here: the batch runner
reports each malformed line in the batch's error file, as OpenAI does. This route alone takes bodies past
``max_body_bytes`` (``files_controller``). Unknown ids are 404 ``file_not_found``, another tenant's too;
an unreachable store is 503 ``file_store_unavailable`` with Retry-After. File text is never logged.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from litestar import Controller, Request, Response, delete, get, post
from litestar.enums import RequestEncodingType
from litestar.exceptions.http_exceptions import RequestEntityTooLarge
from litestar.openapi import ResponseSpec
from litestar.params import Body, FromPath, FromQuery

from gateway.auth import require_tenant, tenant_of
from gateway.errors import ErrorBody, OpenAIError, invalid_request
from gateway.files.retention import form_expires_after_s
from gateway.files.schemas import FileDeleted, FileList, FileObject, FileUpload
from gateway.state import GatewayState
from gateway.upload_slots import take_upload_slot, upload_slots
from sluice.stores.files.base import ObjectStoreUnavailable
from sluice.stores.files.catalog import UnknownFileError

log = logging.getLogger(__name__)

# Room in an upload's body for the multipart framing around the file: boundaries, part headers (with the
# filename), the purpose field.
MULTIPART_OVERHEAD_BYTES = 64 * 1024
MAX_LIST_LIMIT = 10_000

_ERRORS = {
    400: "Invalid upload or query (`param` names the field): a purpose other than `batch`, an empty "
    "file, `file_too_large`, a name not ending `.jsonl`, a file that is not UTF-8, an `expires_after` "
    "whose anchor is not `created_at` or whose seconds are not 3600 to 2592000.",
    401: "`invalid_api_key`: no key, or one no tenant has.",
    404: "`file_not_found`: no such file for this tenant.",
    408: "`upload_timeout`: the upload's body did not arrive within `SLUICE_FILE_UPLOAD_TIMEOUT_S`.",
    413: "`file_too_large`: the upload's body is over the limit for a file (`SLUICE_FILE_MAX_BYTES`).",
    503: "`file_store_unavailable` (the object store holding files), `tenant_store_unavailable`, or "
    "(uploads) `too_many_uploads` (the gateway is reading `SLUICE_FILE_MAX_CONCURRENT_UPLOADS` uploads "
    "already, or half of them for this tenant); with `Retry-After`.",
}


def _errors(*status_codes: int) -> dict[int, ResponseSpec]:
    return {
        code: ResponseSpec(data_container=ErrorBody, description=_ERRORS[code], generate_examples=False)
        for code in status_codes
    }


def file_not_found(file_id: str) -> OpenAIError:
    shown = file_id if len(file_id) <= 80 else file_id[:80] + "..."
    return OpenAIError(404, f"No such File object: {shown}", param="file_id", code="file_not_found")


def file_too_large(max_bytes: int, status_code: int = 400) -> OpenAIError:
    """400 as OpenAI answers for a batch file over its limit; 413 when the body was refused unread."""
    return OpenAIError(
        status_code,
        f"File is too large: the maximum is {max_bytes} bytes (SLUICE_FILE_MAX_BYTES).",
        param="file",
        code="file_too_large",
    )


@asynccontextmanager
async def _store_errors(what: str) -> AsyncIterator[None]:
    """The catalog's errors as HTTP ones: 404 for an unknown file, 503 for a store that cannot answer."""
    try:
        yield
    except UnknownFileError as exc:
        raise file_not_found(str(exc)) from None
    except ObjectStoreUnavailable as exc:
        # NOTE: the store reports its outage once each way (sluice.stores.files.base.reported); not each call.
        log.debug("%s: the file store is unavailable: %s", what, exc)
        raise OpenAIError(
            503,
            "Files cannot be reached now: the file store is unavailable. Retry later.",
            type="server_error",
            code="file_store_unavailable",
            retry_after_s=5.0,
        ) from None


def _on_body_too_large(request: Request[Any, Any, Any], _: RequestEntityTooLarge) -> Response[Any]:
    """A body past this route's limit: refused before it is read, named as the file being too large, and
    answered (and counted) as every OpenAIError is."""
    gw: GatewayState = request.app.state.gw
    err = file_too_large(gw.settings.file_max_bytes, status_code=413)
    handler = request.app.exception_handlers[OpenAIError]
    response: Response[Any] = handler(request, err)
    return response


class FilesController(Controller):
    path = "/v1/files"
    guards = [require_tenant]  # noqa: RUF012
    tags = ["Files"]  # noqa: RUF012
    exception_handlers = {RequestEntityTooLarge: _on_body_too_large}  # noqa: RUF012

    @post(
        "/",
        status_code=200,
        responses=_errors(400, 401, 408, 413, 503),
        guards=[take_upload_slot],  # after the controller's require_tenant
        middleware=[upload_slots],
    )
    async def create_file(
        self,
        request: Request[Any, Any, Any],
        data: Annotated[FileUpload, Body(media_type=RequestEncodingType.MULTI_PART)],
    ) -> FileObject:
        gw: GatewayState = request.app.state.gw
        try:
            expires_after_s = form_expires_after_s(data.expires_after_anchor, data.expires_after_seconds)
            content = await _checked_upload(data, gw.settings.file_max_bytes)
        finally:
            await data.file.close()
        async with _store_errors("POST /v1/files"):
            stored = await gw.files.create(
                tenant_of(request).tenant_id,
                data.file.filename,
                "batch",
                content,
                expires_after_s=expires_after_s,
            )
        return FileObject.of(stored)

    @get("/", responses=_errors(400, 401, 503))
    async def list_files(
        self,
        request: Request[Any, Any, Any],
        purpose: FromQuery[str | None] = None,
        limit: FromQuery[int] = MAX_LIST_LIMIT,
        order: FromQuery[Literal["asc", "desc"]] = "desc",
        after: FromQuery[str | None] = None,
    ) -> FileList:
        """Newest first (``order=desc``), ``limit`` at a time; ``after``: the page after that file."""
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise invalid_request(f"limit must be in [1, {MAX_LIST_LIMIT}].", param="limit")
        gw: GatewayState = request.app.state.gw
        async with _store_errors("GET /v1/files"):
            files = await gw.files.list(tenant_of(request).tenant_id, purpose or None)
        if order == "asc":
            files.reverse()
        if after:
            ids = [f.file_id for f in files]
            if after not in ids:
                raise invalid_request(f"after: no such File object: {after[:80]}", param="after")
            files = files[ids.index(after) + 1 :]
        page = [FileObject.of(f) for f in files[:limit]]
        return FileList(
            data=page,
            has_more=len(files) > limit,
            first_id=page[0].id if page else None,
            last_id=page[-1].id if page else None,
        )

    @get("/{file_id:str}", responses=_errors(401, 404, 503))
    async def retrieve_file(self, request: Request[Any, Any, Any], file_id: FromPath[str]) -> FileObject:
        gw: GatewayState = request.app.state.gw
        async with _store_errors("GET /v1/files/{file_id}"):
            stored = await gw.files.get(tenant_of(request).tenant_id, file_id)
        return FileObject.of(stored)

    @get(
        "/{file_id:str}/content",
        media_type="application/octet-stream",
        responses=_errors(401, 404, 503),
    )
    async def file_content(self, request: Request[Any, Any, Any], file_id: FromPath[str]) -> Response[bytes]:
        gw: GatewayState = request.app.state.gw
        async with _store_errors("GET /v1/files/{file_id}/content"):
            content = await gw.files.content(tenant_of(request).tenant_id, file_id)
        return Response(content, media_type="application/octet-stream")

    @delete("/{file_id:str}", status_code=200, responses=_errors(401, 404, 503))
    async def delete_file(self, request: Request[Any, Any, Any], file_id: FromPath[str]) -> FileDeleted:
        gw: GatewayState = request.app.state.gw
        async with _store_errors("DELETE /v1/files/{file_id}"):
            stored = await gw.files.delete(tenant_of(request).tenant_id, file_id)
        return FileDeleted(id=stored.file_id)


async def _checked_upload(upload: FileUpload, max_bytes: int) -> bytes:
    """The upload's bytes, or a 400 saying what OpenAI's Batch API would refuse about it."""
    if upload.purpose != "batch":
        shown = upload.purpose if len(upload.purpose) <= 40 else upload.purpose[:40] + "..."
        raise invalid_request(f"'{shown}' is not one of ['batch'] - 'purpose'", param="purpose")
    if not upload.file.filename.endswith(".jsonl"):
        raise invalid_request("Invalid file format for Batch API. Must be .jsonl", param="file")
    content = await upload.file.read(max_bytes + 1)
    if len(content) > max_bytes:
        raise file_too_large(max_bytes)
    if not content:
        raise invalid_request("File is empty: a batch input file holds at least one JSON line.", param="file")
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_request(
            f"File is not UTF-8 text (byte {exc.start} is not valid UTF-8): a batch input file is UTF-8 "
            "JSON lines.",
            param="file",
        ) from None
    return content


def files_controller(file_max_bytes: int) -> type[FilesController]:
    """The controller with its body limit: a file of ``file_max_bytes`` plus the multipart framing around
    it (the app's ``max_body_bytes`` is for JSON requests, and may be far smaller)."""
    return type(
        "FilesController",
        (FilesController,),
        {"request_max_body_size": file_max_bytes + MULTIPART_OVERHEAD_BYTES},
    )
