"""``python -m control_plane.service``: serve the admin API on SLUICE_CONTROL_PLANE_HOST:PORT."""

from __future__ import annotations

import sys

from control_plane.service.app import create_app
from control_plane.service.serving import configure_logging, serve
from sluice.settings import SettingsError, get_settings


def main() -> int:
    configure_logging(service="control-plane")
    try:
        settings = get_settings()
    except SettingsError as exc:
        print(f"control plane: {exc}", file=sys.stderr)
        return 2
    serve(create_app(settings), settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
