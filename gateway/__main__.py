"""``python -m gateway``: serve the gateway with uvicorn on settings.gateway_host:gateway_port."""

from __future__ import annotations

import logging

import uvicorn

from gateway.app import create_app
from sluice.settings import get_settings


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = get_settings()
    app = create_app(settings)
    uvicorn.run(app, host=settings.gateway_host, port=settings.gateway_port, log_level="info")


if __name__ == "__main__":
    main()
