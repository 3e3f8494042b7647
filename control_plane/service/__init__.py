"""The control plane's service: the admin API (Litestar, its own port), behind admin tokens with roles.

``app.create_app`` wires it in one place; ``python -m control_plane.service`` serves it on
``SLUICE_CONTROL_PLANE_HOST``:``SLUICE_CONTROL_PLANE_PORT``.
"""
