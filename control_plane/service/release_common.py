"""What the release endpoints (``releases.py``, ``rollouts.py``) share: the registry's errors as admin
errors, their documented responses, and model names in paths.

Model names may hold ``/`` (``meta-llama/Llama-3.1-8B``). A client sends it percent-encoded in a path
segment (``/admin/v1/models/meta-llama%2FLlama-3.1-8B/route``), but ASGI servers decode the path before
routing, so the name would split into two segments and match nothing. ``keep_encoded_slashes`` makes
routing see ``%2F`` as part of its segment (from the request's raw path), and ``model_name`` turns the
path parameter back into the name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote

from litestar import Litestar
from litestar.openapi import ResponseSpec
from litestar.types import Receive, Scope, Send

from control_plane.service.errors import AdminError, ErrorBody, unavailable
from sluice.stores.registry.base import AlreadyExists, InvalidChange, NotFound, RegistryUnavailable

log = logging.getLogger("sluice.control_plane")

_MEANINGS = {
    400: "`invalid_change`: bad input or a change the registry's rules refuse (the message says which "
    "rule); or an invalid body, `param` naming the field.",
    401: "`invalid_admin_token`: no admin token, an unknown or revoked one, or a tenant API key.",
    403: "`insufficient_role`: the token's role ranks below the one this operation needs.",
    404: "`not_found`: no such model or version.",
    409: "`already_exists`: the model or version exists already, or the model has an active rollout.",
    503: "`registry_unavailable` (or `admin_token_store_unavailable`); with `Retry-After`.",
}


def release_responses(*status_codes: int) -> dict[int, ResponseSpec]:
    """A release handler's ``responses``: each error status with the error body and what it means here."""
    return {
        code: ResponseSpec(data_container=ErrorBody, description=_MEANINGS[code], generate_examples=False)
        for code in status_codes
    }


@contextmanager
def registry_errors() -> Iterator[None]:
    """The registry's errors as the admin API answers them, with the registry's own message."""
    try:
        yield
    except NotFound as exc:
        raise AdminError(404, str(exc), code="not_found") from exc
    except AlreadyExists as exc:
        raise AdminError(409, str(exc), code="already_exists") from exc
    except InvalidChange as exc:
        raise AdminError(400, str(exc), code="invalid_change") from exc
    except RegistryUnavailable as exc:
        log.debug("model registry unavailable: %s", exc)  # the store reports its outage (sluice.outages)
        raise unavailable("model registry", "registry_unavailable") from exc


def model_name(path_param: str) -> str:
    """The model a path segment names (``%2F`` for each ``/`` in it)."""
    return unquote(path_param)


def keep_encoded_slashes(app: Litestar) -> None:
    """Route on the raw path where it holds ``%2F``, so an encoded ``/`` stays inside its segment (see the
    module docstring). Wraps the app's ASGI handler: it runs before Litestar's router."""
    routed = app.asgi_handler

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        raw_path: Any = scope.get("raw_path")
        if scope["type"] == "http" and isinstance(raw_path, bytes) and b"%2f" in raw_path.lower():
            # NOTE: every other escape is decoded as before; only %2F stays encoded (as %2F) for the router.
            text = raw_path.decode("latin-1").replace("%2f", "%2F")
            scope["path"] = "%2F".join(unquote(part) for part in text.split("%2F"))
        await routed(scope, receive, send)

    app.asgi_handler = handler
