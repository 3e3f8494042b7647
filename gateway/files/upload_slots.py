"""At most ``file_max_concurrent_uploads`` uploads are read at once on a gateway.

An upload's body is read whole before its handler runs (the multipart parser holds it, then the file's
bytes are checked and written), so each takes a few times its size in memory: without a bound, a handful
of clients each sending a file of ``file_max_bytes`` could take the gateway's memory and with it every
stream it serves. The bound is taken before a byte of the body is read: ``UploadSlots`` wraps the upload
route (an ASGI middleware). An upload waits up to ``SLOT_WAIT_S`` for a slot (its body stays in the
client's socket meanwhile), then is refused with 503 ``too_many_uploads`` and ``Retry-After``; the
official SDKs retry it.
"""

from __future__ import annotations

import asyncio

from litestar.types import ASGIApp, Receive, Scope, Send

from gateway.errors import OpenAIError

SLOT_WAIT_S = 5.0
RETRY_AFTER_S = 2.0


class UploadLimit:
    """The gateway's upload slots (one per gateway, on ``GatewayState``)."""

    def __init__(self, max_concurrent: int) -> None:
        self.max_concurrent = max_concurrent
        self.num_in_use = 0
        self._slots = asyncio.Semaphore(max_concurrent)

    async def acquire(self, wait_s: float) -> bool:
        """Take a slot, waiting up to ``wait_s``; False when none came free."""
        try:
            async with asyncio.timeout(wait_s):
                await self._slots.acquire()
        except TimeoutError:
            return False
        self.num_in_use += 1
        return True

    def release(self) -> None:
        self.num_in_use -= 1
        self._slots.release()


def too_many_uploads(max_concurrent: int) -> OpenAIError:
    return OpenAIError(
        503,
        f"This gateway is reading {max_concurrent} uploads already (SLUICE_FILE_MAX_CONCURRENT_UPLOADS). "
        "Retry shortly.",
        type="server_error",
        code="too_many_uploads",
        retry_after_s=RETRY_AFTER_S,
    )


def upload_slots(app: ASGIApp) -> ASGIApp:
    """The upload route's middleware: hold a slot of the gateway's ``UploadLimit`` while the request runs."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        limit: UploadLimit = scope["litestar_app"].state.gw.upload_limit
        if not await limit.acquire(SLOT_WAIT_S):
            raise too_many_uploads(limit.max_concurrent)
        try:
            await app(scope, receive, send)
        finally:
            limit.release()

    return middleware
