"""How the control plane process serves: its logging and its uvicorn server on
``SLUICE_CONTROL_PLANE_HOST``:``SLUICE_CONTROL_PLANE_PORT``.

The log is the gateway's format (one line per event, a person reads it); the gateway's own helpers are
not imported (applications do not import each other). uvicorn's access log is off: the metrics
middleware logs each admin request once, with who made it.
"""

from __future__ import annotations

import uvicorn
from litestar import Litestar

from sluice import logs
from sluice.settings import Settings

SHUTDOWN_GRACE_S = 5  # admin requests are short: a restart does not wait long for them
configure_logging = logs.configure_logging  # the gateway's log too (sluice.logs)


def uvicorn_config(app: Litestar, settings: Settings, *, uvicorn_log_level: str = "info") -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.control_plane_host,
        port=settings.control_plane_port,
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        lifespan="on",
        access_log=False,
        log_level=uvicorn_log_level,
        log_config=None,  # uvicorn's lines go through the process's log (sluice.logs)
    )


def serve(app: Litestar, settings: Settings, *, uvicorn_log_level: str = "info") -> None:
    """Serve until SIGINT or SIGTERM (uvicorn's handlers), then shut down gracefully."""
    uvicorn.Server(uvicorn_config(app, settings, uvicorn_log_level=uvicorn_log_level)).run()
