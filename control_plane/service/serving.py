"""How the control plane process serves: its logging and its uvicorn server on
``SLUICE_CONTROL_PLANE_HOST``:``SLUICE_CONTROL_PLANE_PORT``.

The log is the gateway's format (one line per event, a person reads it); the gateway's own helpers are
not imported (applications do not import each other). uvicorn's access log is off: the metrics
middleware logs each admin request once, with who made it.
"""

from __future__ import annotations

import logging

import uvicorn
from litestar import Litestar

from sluice.settings import Settings

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
SHUTDOWN_GRACE_S = 5  # admin requests are short: a restart does not wait long for them


def configure_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT)
    for name in ("httpx", "httpcore"):  # a line per call at INFO
        logging.getLogger(name).setLevel(max(level, logging.WARNING))


def uvicorn_config(app: Litestar, settings: Settings, *, uvicorn_log_level: str = "info") -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.control_plane_host,
        port=settings.control_plane_port,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        lifespan="on",
        access_log=False,
        log_level=uvicorn_log_level,
    )


def serve(app: Litestar, settings: Settings, *, uvicorn_log_level: str = "info") -> None:
    """Serve until SIGINT or SIGTERM (uvicorn's handlers), then shut down gracefully."""
    uvicorn.Server(uvicorn_config(app, settings, uvicorn_log_level=uvicorn_log_level)).run()
