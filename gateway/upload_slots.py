"""At most ``file_max_concurrent_uploads`` uploads are read at once on a gateway, and at most half of them
(``max_per_tenant``, at least one) for one tenant.

An upload's body is read whole before its handler runs (the multipart parser holds it, then the file's
bytes are checked and written), so each takes a few times its size in memory: without a bound, a handful
of clients each sending a file of ``file_max_bytes`` could take the gateway's memory and with it every
stream it serves. The bound is taken before a byte of the body is read, and after the key is checked:
``take_upload_slot`` is a guard of the upload route (Litestar runs guards before it parses the body, and
the tenant's own guard before it), so a caller without a valid key never holds a slot, and a tenant
trickling its uploads' bodies holds at most ``max_per_tenant`` slots, never every other tenant's.
``upload_slots``, the route's middleware, gives the slot back however the request ends. An upload waits
up to ``SLOT_WAIT_S`` for a slot (its body stays in the client's socket meanwhile), then is refused with
503 ``too_many_uploads`` and ``Retry-After``; the official SDKs retry it.

A slot is held only while the body arrives in time: the middleware gives the whole body
``file_upload_timeout_s`` from the request's start (a 100 MiB file at 300 s needs ~350 KB/s), then answers
408 ``upload_timeout``, so a client trickling its body cannot keep a slot.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.types import ASGIApp, Receive, ReceiveMessage, Scope, Send

from gateway.errors import OpenAIError
from sluice.domain import Tenant

SLOT_WAIT_S = 5.0
RETRY_AFTER_S = 2.0
_HELD = "upload_slot_tenant_id"  # the request state's key: the tenant whose slot the request holds


@dataclass
class _TenantSlots:
    slots: asyncio.Semaphore
    num_users: int = 0  # requests holding or waiting for one of them: the entry goes at 0


class UploadLimit:
    """The gateway's upload slots (one per gateway, on ``GatewayState``)."""

    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent
        self.max_per_tenant = max(1, max_concurrent // 2)
        self.num_in_use = 0
        self._slots = asyncio.Semaphore(max_concurrent)
        self._by_tenant: dict[str, _TenantSlots] = {}

    async def acquire(self, tenant_id: str, wait_s: float) -> bool:
        """Take one of the tenant's slots and one of the gateway's, waiting up to ``wait_s`` for both;
        False when none came free."""
        own = self._by_tenant.setdefault(tenant_id, _TenantSlots(asyncio.Semaphore(self.max_per_tenant)))
        own.num_users += 1
        try:
            async with asyncio.timeout(wait_s):
                await own.slots.acquire()
                try:
                    await self._slots.acquire()
                except BaseException:
                    own.slots.release()
                    raise
        except BaseException as exc:
            self._forget(tenant_id, own)
            if isinstance(exc, TimeoutError):
                return False
            raise
        self.num_in_use += 1
        return True

    def release(self, tenant_id: str) -> None:
        self.num_in_use -= 1
        self._slots.release()
        own = self._by_tenant[tenant_id]
        own.slots.release()
        self._forget(tenant_id, own)

    def _forget(self, tenant_id: str, own: _TenantSlots) -> None:
        own.num_users -= 1
        if own.num_users == 0:
            del self._by_tenant[tenant_id]


def too_many_uploads(limit: UploadLimit) -> OpenAIError:
    return OpenAIError(
        503,
        f"This gateway is reading {limit.max_concurrent} uploads already "
        f"(SLUICE_FILE_MAX_CONCURRENT_UPLOADS), or {limit.max_per_tenant} of this tenant's. Retry shortly.",
        type="server_error",
        code="too_many_uploads",
        retry_after_s=RETRY_AFTER_S,
    )


async def take_upload_slot(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
    """The upload route's guard, after the tenant's: hold one of the gateway's upload slots for the
    caller's tenant (503 ``too_many_uploads`` when none comes free in ``SLOT_WAIT_S``)."""
    limit: UploadLimit = connection.app.state.gw.upload_limit
    # NOTE: gateway.auth.tenant_of reads the same; not imported, as gateway.auth imports gateway.state,
    # which imports this module.
    tenant: Tenant = connection.state.tenant
    tenant_id = tenant.tenant_id
    if not await limit.acquire(tenant_id, SLOT_WAIT_S):
        raise too_many_uploads(limit)
    connection.state[_HELD] = tenant_id


def upload_timeout(timeout_s: float) -> OpenAIError:
    return OpenAIError(
        408,
        f"The upload's body did not arrive within {timeout_s:g} s (SLUICE_FILE_UPLOAD_TIMEOUT_S).",
        code="upload_timeout",
        param="file",
    )


def _body_deadline(receive: Receive, timeout_s: float) -> Receive:
    """``receive``, raising 408 ``upload_timeout`` once ``timeout_s`` from now passed."""
    deadline_s = time.monotonic() + timeout_s

    async def receive_in_time() -> ReceiveMessage:
        try:
            async with asyncio.timeout(deadline_s - time.monotonic()):
                return await receive()
        except TimeoutError:
            raise upload_timeout(timeout_s) from None

    return receive_in_time


def upload_slots(app: ASGIApp) -> ASGIApp:
    """The upload route's middleware: the body's deadline, and give back the slot ``take_upload_slot``
    took, however the request ends (answered, refused, timed out, or its client gone mid-body)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        timeout_s = scope["litestar_app"].state.gw.settings.file_upload_timeout_s
        try:
            await app(scope, _body_deadline(receive, timeout_s), send)
        finally:
            tenant_id = scope.get("state", {}).pop(_HELD, None)
            if tenant_id is not None:
                scope["litestar_app"].state.gw.upload_limit.release(tenant_id)

    return middleware
