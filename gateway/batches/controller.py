"""OpenAI's Batch API: ``POST /v1/batches``, ``GET /v1/batches``, ``GET /v1/batches/{id}``,
``POST /v1/batches/{id}/cancel``. A tenant sees only its own batches (another's id is unknown).

Creating a batch checks what needs no reading of the file (the endpoint, the window, the metadata, the
``output_expires_after``, that the input file is the tenant's and for ``batch``, that the key may use the
batch class, that the tenant has fewer than ``SLUICE_BATCH_MAX_ACTIVE_PER_TENANT`` batches queued or
running), copies the input file to the batch's own key (``batches/<tenant>/<batch_id>/input.jsonl``,
so that deleting the file, or its expiry, leaves the batch alone), and queues it as ``validating``; the
runner (``gateway.batches.runner``) reads and checks the copy's lines, then runs them, and deletes the
copy when the batch ends.
"""

from __future__ import annotations

import secrets
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.openapi import ResponseSpec
from litestar.params import JSONBody, Parameter

from gateway.auth import require_tenant, tenant_of
from gateway.batches.lines import ENDPOINTS
from gateway.errors import ErrorBody, OpenAIError, error_responses, invalid_request, refused
from gateway.files.retention import ExpiresAfter, output_expires_after_s
from gateway.state import GatewayState
from sluice.domain import RequestClass
from sluice.stores.batches.base import Batch, BatchStatus, BatchStoreUnavailable, UnknownBatchError
from sluice.stores.files.base import ObjectStoreUnavailable
from sluice.stores.files.catalog import UnknownFileError

COMPLETION_WINDOWS = {"24h": timedelta(hours=24)}
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
CANCELLABLE = frozenset(
    {
        BatchStatus.VALIDATING,
        BatchStatus.IN_PROGRESS,
        BatchStatus.FINALIZING,
        BatchStatus.CANCELLING,
        BatchStatus.CANCELLED,
    }
)


class CreateBatchRequest(msgspec.Struct, forbid_unknown_fields=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None  # the result files' retention


class BatchErrorOut(msgspec.Struct):
    code: str
    message: str
    line: int | None
    param: str | None


class BatchErrorsOut(msgspec.Struct):
    data: list[BatchErrorOut]
    object: str = "list"


class RequestCountsOut(msgspec.Struct):
    total: int
    completed: int
    failed: int


class BatchOut(msgspec.Struct):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int  # unix seconds, as every time here
    expires_at: int
    request_counts: RequestCountsOut
    errors: BatchErrorsOut | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    metadata: dict[str, str] | None = None
    object: str = "batch"


class BatchListOut(msgspec.Struct):
    data: list[BatchOut]
    first_id: str | None
    last_id: str | None
    has_more: bool
    object: str = "list"


def _unix(ts: datetime | None) -> int | None:
    return None if ts is None else int(ts.timestamp())


def batch_out(batch: Batch) -> BatchOut:
    counts = batch.request_counts
    errors = None
    if batch.errors:
        errors = BatchErrorsOut([BatchErrorOut(e.code, e.message, e.line, e.param) for e in batch.errors])
    return BatchOut(
        id=batch.batch_id,
        endpoint=batch.endpoint,
        input_file_id=batch.input_file_id,
        completion_window=batch.completion_window,
        status=str(batch.status),
        created_at=int(batch.created_at.timestamp()),
        expires_at=int(batch.expires_at.timestamp()),
        request_counts=RequestCountsOut(counts.total, counts.completed, counts.failed),
        errors=errors,
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        in_progress_at=_unix(batch.in_progress_at),
        finalizing_at=_unix(batch.finalizing_at),
        completed_at=_unix(batch.completed_at),
        failed_at=_unix(batch.failed_at),
        expired_at=_unix(batch.expired_at),
        cancelling_at=_unix(batch.cancelling_at),
        cancelled_at=_unix(batch.cancelled_at),
        metadata=batch.metadata or None,
    )


def _unavailable(what: str) -> OpenAIError:
    return OpenAIError(
        503,
        f"The {what} is unavailable; retry later.",
        type="server_error",
        code=f"{what.replace(' ', '_')}_unavailable",
        retry_after_s=5.0,
    )


def _batch_not_found(batch_id: str) -> OpenAIError:
    shown = batch_id if len(batch_id) <= 80 else batch_id[:80] + "..."
    return OpenAIError(404, f"No batch found with id {shown!r}.", code="batch_not_found", param="batch_id")


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise invalid_request(f"metadata may have at most {MAX_METADATA_PAIRS} pairs.", param="metadata")
    for key, value in metadata.items():
        if not 1 <= len(key) <= MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise invalid_request(
                f"metadata keys are 1 to {MAX_METADATA_KEY_CHARS} characters and values at most "
                f"{MAX_METADATA_VALUE_CHARS}.",
                param="metadata",
            )


async def _copy_input(gw: GatewayState, tenant_id: str, file_id: str, batch_id: str) -> str:
    """Copy the tenant's input file ``file_id`` (purpose ``batch``) to the batch's own key; the key. 404
    for a file the tenant does not have (or that expired), 400 for another purpose, 503 for a store that
    cannot answer."""
    input_key = f"batches/{tenant_id}/{batch_id}/input.jsonl"
    try:
        stored = await gw.files.get(tenant_id, file_id)
        if stored.purpose != "batch":
            raise invalid_request("The input file's purpose must be 'batch'.", param="input_file_id")
        await gw.files.copy_content(tenant_id, file_id, input_key)
    except UnknownFileError:
        raise OpenAIError(
            404, "No file found with that id.", code="file_not_found", param="input_file_id"
        ) from None
    except ObjectStoreUnavailable:
        raise _unavailable("file store") from None
    return input_key


async def _check_active_cap(gw: GatewayState, tenant_id: str) -> None:
    """429 ``too_many_batches`` when the tenant already has ``batch_max_active_per_tenant`` batches queued or
    running. Runners take tenants in turns (``BatchStore.claim``), so a backlog delays no other tenant;
    the cap bounds what it costs: an input copy per batch, and the rows every claim ranks. Checked before
    the input is copied. Two creates at the same instant may both pass: the cap is exceeded by at most
    the tenant's concurrent creates, which is enough to bound the queue."""
    max_active = gw.settings.batch_max_active_per_tenant
    try:
        num_active = await gw.batches.num_active(tenant_id)
    except BatchStoreUnavailable:
        raise _unavailable("batch store") from None
    if num_active >= max_active:
        raise refused(
            429,
            "too_many_batches",
            f"This tenant has {num_active} batches queued or running, the most it may have "
            f"(SLUICE_BATCH_MAX_ACTIVE_PER_TENANT={max_active}); create more once some have ended, or "
            "cancel some.",
            retry_after_s=None,
        )


BatchId = Annotated[str, Parameter(max_length=128, description="The batch's id (`batch_...`).")]


_CREATE_RESPONSES = {
    **error_responses(400, 401, 403, 404, 503),
    429: ResponseSpec(
        data_container=ErrorBody,
        description="`too_many_batches`: the tenant has `SLUICE_BATCH_MAX_ACTIVE_PER_TENANT` batches queued "
        "or running already.",
        generate_examples=False,
    ),
}


class BatchesController(Controller):
    path = "/v1/batches"
    guards = [require_tenant]  # noqa: RUF012 — Litestar's declaration style
    tags = ["Batches"]  # noqa: RUF012

    @post("/", status_code=200, responses=_CREATE_RESPONSES)
    async def create(self, request: Request[Any, Any, Any], data: JSONBody[CreateBatchRequest]) -> BatchOut:
        """Queue a batch of requests from an uploaded JSONL file (purpose ``batch``). Its lines run at the
        batch class, billed as batch usage; the results go to an output file and an error file."""
        gw: GatewayState = request.app.state.gw
        tenant = tenant_of(request)
        if RequestClass.BATCH not in tenant.allowed_classes:
            raise OpenAIError(
                403,
                "This API key may not use the batch class.",
                type="permission_error",
                code="service_tier_not_allowed",
            )
        if data.endpoint not in ENDPOINTS:
            raise invalid_request(f"endpoint must be one of {sorted(ENDPOINTS)}.", param="endpoint")
        window = COMPLETION_WINDOWS.get(data.completion_window)
        if window is None:
            raise invalid_request(
                f"completion_window must be one of {sorted(COMPLETION_WINDOWS)}.", param="completion_window"
            )
        _check_metadata(data.metadata)
        results_expire_after_s = output_expires_after_s(data.output_expires_after)
        await _check_active_cap(gw, tenant.tenant_id)
        batch_id = f"batch_{secrets.token_hex(16)}"
        input_key = await _copy_input(gw, tenant.tenant_id, data.input_file_id, batch_id)
        now = datetime.now(UTC)
        batch = Batch(
            batch_id=batch_id,
            tenant_id=tenant.tenant_id,
            endpoint=data.endpoint,
            input_file_id=data.input_file_id,
            completion_window=data.completion_window,
            status=BatchStatus.VALIDATING,
            created_at=now,
            expires_at=now + window,
            metadata=dict(data.metadata or {}),
            output_expires_after_s=results_expire_after_s,
            input_key=input_key,
        )
        try:
            await gw.batches.create(batch)
        except BatchStoreUnavailable:
            with suppress(Exception):  # no batch reads it (best effort: a leftover costs only space)
                await gw.files.store.delete(input_key)
            raise _unavailable("batch store") from None
        gw.batch_runner.wake()
        return batch_out(batch)

    @get("/", responses=error_responses(400, 401, 404, 503))
    async def list_batches(
        self,
        request: Request[Any, Any, Any],
        after: Annotated[str | None, Parameter(max_length=128)] = None,
        limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
    ) -> BatchListOut:
        """The caller's batches, newest first; ``after``: a batch id, to page on."""
        gw: GatewayState = request.app.state.gw
        try:
            batches = await gw.batches.list(tenant_of(request).tenant_id, after=after, limit=limit + 1)
        except UnknownBatchError:
            raise _batch_not_found(after or "") from None
        except BatchStoreUnavailable:
            raise _unavailable("batch store") from None
        page = [batch_out(b) for b in batches[:limit]]
        return BatchListOut(
            page, page[0].id if page else None, page[-1].id if page else None, len(batches) > limit
        )

    @get("/{batch_id:str}", responses=error_responses(401, 404, 503))
    async def retrieve(self, request: Request[Any, Any, Any], batch_id: BatchId) -> BatchOut:
        gw: GatewayState = request.app.state.gw
        try:
            return batch_out(await gw.batches.get(tenant_of(request).tenant_id, batch_id))
        except UnknownBatchError:
            raise _batch_not_found(batch_id) from None
        except BatchStoreUnavailable:
            raise _unavailable("batch store") from None

    @post("/{batch_id:str}/cancel", status_code=200, responses=error_responses(400, 401, 404, 503))
    async def cancel(self, request: Request[Any, Any, Any], batch_id: BatchId) -> BatchOut:
        """Stop a batch: lines running are cancelled (billed for what they generated), no more start; it
        is ``cancelling`` until its result files are written, then ``cancelled``. Cancelling again is a
        no-op; a batch that already ended cannot be cancelled (400)."""
        gw: GatewayState = request.app.state.gw
        tenant = tenant_of(request)
        try:
            batch = await gw.batches.request_cancel(tenant.tenant_id, batch_id, datetime.now(UTC))
        except UnknownBatchError:
            raise _batch_not_found(batch_id) from None
        except BatchStoreUnavailable:
            raise _unavailable("batch store") from None
        if batch.status not in CANCELLABLE:
            raise invalid_request(
                f"The batch has already ended ({batch.status}); it cannot be cancelled.",
                code="batch_not_cancellable",
            )
        gw.batch_runner.cancel_requested(batch_id)
        return batch_out(batch)
