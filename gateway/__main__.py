"""``python -m gateway``: serve the gateway on settings.gateway_host:gateway_port (see gateway.serving)."""

from __future__ import annotations

from gateway.app import create_app
from gateway.serving import configure_logging, serve
from sluice.settings import get_settings


def main() -> None:
    configure_logging(service="gateway")
    settings = get_settings()
    serve(create_app(settings), settings)


if __name__ == "__main__":
    main()
