"""The control plane's Prometheus metrics (a registry per app, so tests can run several), and the one
middleware that counts and logs every routed request.

Requests are counted by route template (``/admin/v1/tokens/{name:str}``, never the raw path, so names
cannot grow the label set), method and status; requests no route matched count as route ``unmatched``
(in the app's exception handler, where they end). Admin requests (``/admin/...``) are logged one line
each, with who made them: an audit trail a person can read. Probes, scrapes and the schema are counted
but not logged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from sluice.logs import QuietedLines

log = logging.getLogger("sluice.control_plane")

UNMATCHED_ROUTE = "unmatched"
ADMIN_PATH_PREFIX = "/admin/"


class ControlPlaneMetrics:
    def __init__(self, replica_hour_price_usd: float | None = None) -> None:
        """``replica_hour_price_usd``: ``Settings.replica_hour_price_usd``, exported when set (the cost
        recording rule in deploy/prometheus multiplies replicas by it)."""
        self.registry = CollectorRegistry()
        self.registry.register(QuietedLines())  # the pool's retries, not logged
        if replica_hour_price_usd is not None:
            price = Gauge(
                "sluice_control_plane_replica_hour_price_usd",
                "What one replica costs an hour, in USD (SLUICE_REPLICA_HOUR_PRICE_USD)",
                registry=self.registry,
            )
            price.set(replica_hour_price_usd)
        self.requests = Counter(
            "sluice_control_plane_requests",
            "Requests by route template, method and HTTP status code",
            ["route", "method", "status_code"],
            registry=self.registry,
        )
        self.auth_refusals = Counter(
            "sluice_control_plane_auth_refusals",
            "Admin requests refused by the auth guard, by reason (no_token, not_admin_token, "
            "unknown_token, insufficient_role)",
            ["reason"],
            registry=self.registry,
        )

    def count_request(self, route: str, method: str, status_code: int) -> None:
        self.requests.labels(route, method, str(status_code)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def observe_requests(metrics: ControlPlaneMetrics) -> Any:
    """A Litestar middleware (it runs once a route matched, around the route's own error handling, so it
    sees the status of every response, errors included)."""

    def middleware(app: ASGIApp) -> ASGIApp:
        async def observed(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            start_s = time.perf_counter()
            status_code = 500  # the app died before it answered: uvicorn sends a 500

            async def send_observed(message: Message) -> None:
                nonlocal status_code
                if message["type"] == "http.response.start":
                    status_code = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_observed)
            finally:
                route = scope.get("path_template") or UNMATCHED_ROUTE
                metrics.count_request(route, str(scope.get("method", "")), status_code)
                if route.startswith(ADMIN_PATH_PREFIX):
                    _log_request(scope, status_code, time.perf_counter() - start_s)

        return observed

    return middleware


def _log_request(scope: Scope, status_code: int, duration_s: float) -> None:
    principal = scope.get("state", {}).get("principal")
    who = f"{principal.name} ({principal.role})" if principal is not None else "an unauthenticated caller"
    method = scope.get("method", "")
    log.info("%s %s -> %d in %.1f ms by %s", method, scope["path"], status_code, duration_s * 1000, who)
