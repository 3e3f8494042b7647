"""GET /healthz (the process is alive), GET /readyz (static routing: the replica is ready and the model
loaded; registry routing: a snapshot was read and at least one verified replica is in rotation), GET
/metrics (Prometheus). No auth: probes and scrapers call these."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.state import GatewayState


@get("/healthz", tags=["System"])
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", tags=["System"])
async def readyz(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    gw: GatewayState = request.app.state.gw
    if gw.engine is None:  # following the registry
        assert gw.follower is not None
        ready = gw.follower.generation >= 0 and gw.router.pools.num_in_rotation > 0
        routing = {"routing": "registry", **gw.follower.report(), **gw.router.report()}
        return Response(
            {"status": "ready" if ready else "not_ready", **routing}, status_code=200 if ready else 503
        )
    replica_ready = await gw.engine.ready()
    model_loaded = replica_ready and await gw.engine.model_loaded(gw.settings.model_name)
    body = {
        "status": "ready" if model_loaded else "not_ready",
        "routing": "static",
        "engine_client": gw.engine.kind,
        "replica": gw.engine.replica,
        "replica_ready": replica_ready,
        "model": gw.settings.model_name,
        "model_loaded": model_loaded,
    }
    return Response(body, status_code=200 if model_loaded else 503)


@get("/metrics", tags=["System"], include_in_schema=False)
async def metrics(request: Request[Any, Any, Any]) -> Response[bytes]:
    gw: GatewayState = request.app.state.gw
    return Response(gw.metrics.render(), media_type=CONTENT_TYPE_LATEST)


SYSTEM_HANDLERS = [healthz, readyz, metrics]
