"""How a gateway process serves: its logging and its uvicorn server, both from settings. The one place
``python -m gateway``, ``make run`` (``gateway.devstack``) and the tests' gateways take them from.

The server: uvicorn's httptools protocol with the client limits of ``gateway.slow_clients`` (write
deadline, bounded send buffers, request-head timeout and size), uvicorn's keep-alive timeout, and a
per-process bound on connections and requests (``limit_concurrency``: over it, 503), and a grace period
at shutdown (``shutdown_grace_s``) after which streams still running are cancelled. uvicorn's
``h11_max_incomplete_event_size`` does not apply: the protocol is httptools, bounded by
``max_request_head_bytes`` instead. No access log: every request is in the telemetry file and the
metrics, and a line per request would bury what the log is for.
"""

from __future__ import annotations

import uvicorn
from litestar import Litestar

from gateway.slow_clients import ClientLimits, guarded_protocol
from sluice import logs
from sluice.settings import Settings

# The process's log (sluice.logs): one format, the noisy libraries quieted and counted.
configure_logging = logs.configure_logging


def client_limits(settings: Settings) -> ClientLimits:
    return ClientLimits(
        write_timeout_s=settings.client_write_timeout_s,
        send_buffer_bytes=settings.client_send_buffer_bytes,
        header_timeout_s=settings.client_header_timeout_s,
        max_head_bytes=settings.max_request_head_bytes,
    )


def uvicorn_config(app: Litestar, settings: Settings, *, uvicorn_log_level: str = "info") -> uvicorn.Config:
    """The server for ``app`` on settings.gateway_host:gateway_port. ``uvicorn_log_level`` is for
    uvicorn's own loggers (its start-up lines and errors)."""
    return uvicorn.Config(
        app,
        host=settings.gateway_host,
        port=settings.gateway_port,
        http=guarded_protocol(client_limits(settings)),
        timeout_keep_alive=settings.keep_alive_timeout_s,
        limit_concurrency=settings.max_connections,
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        lifespan="on",
        access_log=False,
        log_level=uvicorn_log_level,
        log_config=None,  # uvicorn's lines go through the process's log (sluice.logs), not its own format
    )


def serve(app: Litestar, settings: Settings, *, uvicorn_log_level: str = "info") -> None:
    """Serve until SIGINT or SIGTERM (uvicorn's handlers), then shut down gracefully."""
    uvicorn.Server(uvicorn_config(app, settings, uvicorn_log_level=uvicorn_log_level)).run()
