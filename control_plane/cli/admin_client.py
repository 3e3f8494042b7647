"""The admin API as the CLI's commands call it: one authenticated request, its JSON answer, or an
``AdminApiError`` whose message is what the service said (its OpenAI-style error body), or that it could
not be reached. The URL and token come from ``--admin-url`` / ``--token``, else ``SLUICE_ADMIN_URL`` /
``SLUICE_ADMIN_TOKEN``, else the control plane's own address from settings (no token: the call fails
with the service's 401, which says how to get one).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import httpx

from sluice.settings import Settings, load_settings

TIMEOUT_S = 30.0


class AdminApiError(Exception):
    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True)
class AdminApi:
    base_url: str  # http://host:port, no path
    token: str | None

    @classmethod
    def from_args(cls, args: argparse.Namespace, settings: Settings | None = None) -> AdminApi:
        settings = settings or load_settings()
        default = settings.admin_url or f"http://{settings.control_plane_host}:{settings.control_plane_port}"
        return cls(
            (getattr(args, "admin_url", None) or default).rstrip("/"),
            getattr(args, "token", None) or settings.admin_token,
        )

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, **params: Any) -> Any:
        """``method`` ``/admin/v1{path}``; the decoded JSON (None for an empty answer)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        query = {k: v for k, v in params.items() if v is not None}
        url = f"{self.base_url}/admin/v1{path}"
        try:
            response = httpx.request(method, url, json=body, params=query, headers=headers, timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise AdminApiError(f"the admin API at {self.base_url} is unreachable: {exc}") from None
        if response.status_code >= 400:
            message = _error_message(response)
            if response.status_code == 401 and not self.token:
                message += (
                    " Pass --token or set SLUICE_ADMIN_TOKEN (`make run` prints the dev token; "
                    "`sluice admin-tokens create NAME --role ROLE` makes one)."
                )
            raise AdminApiError(message, response.status_code)
        return response.json() if response.content else None


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{response.status_code} {error.get('code') or error.get('type')}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:200]}"


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--admin-url`` and ``--token`` on a command that calls the admin API."""
    parser.add_argument(
        "--admin-url", help="the control plane (default: SLUICE_ADMIN_URL, else its host:port)"
    )
    parser.add_argument("--token", help="an admin token (default: SLUICE_ADMIN_TOKEN)")
