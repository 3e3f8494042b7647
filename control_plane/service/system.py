"""GET /healthz (the process is alive), GET /readyz (the admin token store and the registry answer),
GET /metrics (Prometheus). No auth: probes and scrapers call these, and they reveal no state."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST

from control_plane.service.state import state_of
from sluice.stores.admin_tokens.base import AdminTokenStoreUnavailable
from sluice.stores.registry.base import RegistryUnavailable

log = logging.getLogger("sluice.control_plane")

# A probe must answer within its own timeout (often 1-5 s): a store slower than this counts as down.
READY_CHECK_TIMEOUT_S = 2.0


@get("/healthz", tags=["System"])
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def _answers(what: str, call: Awaitable[Any]) -> bool:
    try:
        await asyncio.wait_for(call, READY_CHECK_TIMEOUT_S)
    except (AdminTokenStoreUnavailable, RegistryUnavailable, TimeoutError) as exc:
        log.warning("readyz: the %s does not answer: %s", what, exc or type(exc).__name__)
        return False
    return True


@get("/readyz", tags=["System"])
async def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """200 when every store the admin API needs answers, else 503 naming which do not."""
    cp = state_of(request)
    tokens_ok = await _answers("admin token store", cp.tokens.ping())
    registry_ok = await _answers("model registry", cp.registry.generation())
    ready = tokens_ok and registry_ok
    body = {
        "status": "ready" if ready else "not_ready",
        "admin_token_store": "ok" if tokens_ok else "unavailable",
        "registry": "ok" if registry_ok else "unavailable",
    }
    return Response(body, status_code=200 if ready else 503)


@get("/metrics", tags=["System"], include_in_schema=False)
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    return Response(state_of(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


SYSTEM_HANDLERS = [healthz, readyz, metrics]
