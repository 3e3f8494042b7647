"""The registry's models, versions and routes, and its audit log, for release managers.

viewer: ``GET /models/{model}``, ``GET /models/{model}/versions``, ``GET /models/{model}/route``,
``GET /audit``. release-manager: ``POST /models``, ``POST /models/{model}/versions``,
``POST /models/{model}/versions/{version}/state``, ``PUT /models/{model}/route``.

Every write's actor is the admin token's name, and it answers with ``generation``: the registry's
generation read right after the change (the change's own, or later if another change followed at once),
so a gateway at that generation or later routes by it. A route write is the traffic change itself:
gateways follow the registry. Model names holding ``/`` are sent as ``%2F`` (``release_common``).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import msgspec
from litestar import Controller, Request, get, post, put
from litestar.handlers import HTTPRouteHandler
from litestar.params import FromPath, FromQuery, JSONBody

from control_plane.service.auth import SECURITY_SCHEME, needs, principal_of, require_admin
from control_plane.service.models import ModelView, RouteEntryView, VersionView, models_view
from control_plane.service.release_common import model_name, registry_errors, release_responses
from control_plane.service.state import state_of
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.registry.base import AuditEntry, NotFound, Registry, VersionState

log = logging.getLogger("sluice.control_plane")

MAX_AUDIT_ROWS = 1000


class ModelDetail(msgspec.Struct):
    generation: int  # the registry state shown
    model: ModelView


class VersionsView(msgspec.Struct):
    generation: int
    versions: list[VersionView]  # by version name


class RouteView(msgspec.Struct):
    generation: int
    model: str
    route: list[RouteEntryView] | None  # None: the model is not routed (not served)


class VersionDetail(msgspec.Struct):
    generation: int
    version: VersionView


class AuditView(msgspec.Struct):
    generation: int
    at: datetime
    actor: str
    action: str  # model.create, version.add, version.state, route.set, replica.*, rollout.*
    model: str
    subject: str  # "model", "version v2", "route", "replica r-7", "rollout"
    before: Any
    after: Any


class CreateModelBody(msgspec.Struct, forbid_unknown_fields=True):
    name: str  # as clients ask for it: letters, digits and . _ : / -, at most 128
    description: str = ""


class AddVersionBody(msgspec.Struct, forbid_unknown_fields=True):
    version: str  # unique within the model, never reused
    artifact_uri: str  # scheme://..., where the weights (or the built engine) are
    weights_digest: str  # sha256:<64 hex>, as sluice.weights_digest computes it
    build_config: dict[str, Any] = msgspec.field(default_factory=dict)


class VersionStateBody(msgspec.Struct, forbid_unknown_fields=True):
    state: VersionState  # along staged -> warming -> serving -> draining -> retired


class RouteBody(msgspec.Struct, forbid_unknown_fields=True):
    weights_bp: dict[str, int]  # {version: basis points}, summing to 10 000
    version_states: dict[str, VersionState] | None = None  # changed in the same write


def audit_view(e: AuditEntry) -> AuditView:
    return AuditView(e.generation, e.at, e.actor, str(e.action), e.model, e.subject, e.before, e.after)


async def model_detail(registry: Registry, model: str) -> ModelDetail:
    """The model as ``GET /models`` shows it, from one snapshot; ``NotFound`` (404) without it."""
    listing = models_view(await registry.snapshot())
    found = next((m for m in listing.models if m.name == model), None)
    if found is None:
        raise NotFound(f"no model {model!r}")
    return ModelDetail(listing.generation, found)


def _actor(request: Request[Any, Any, Any]) -> str:
    return principal_of(request).name


@post(
    "/admin/v1/models",
    opt=needs(Role.RELEASE_MANAGER),
    guards=[require_admin],
    security=[{SECURITY_SCHEME: []}],
    tags=["Releases"],
    responses=release_responses(400, 401, 403, 409, 503),
)
async def create_model(request: Request[Any, Any, Any], data: JSONBody[CreateModelBody]) -> ModelDetail:
    """Register a model (no versions, no route: not served yet).

    NOTE: a handler of its own, not in ``ReleaseController``: ``GET /admin/v1/models`` is in another
    controller, and two controllers on one path collide in Litestar; register it after that one."""
    registry = state_of(request).registry
    with registry_errors():
        await registry.create_model(data.name, actor=_actor(request), description=data.description)
        detail = await model_detail(registry, data.name)
    log.info("model %r created by %s", data.name, _actor(request))
    return detail


class ReleaseController(Controller):
    path = "/admin/v1"
    tags = ["Releases"]  # noqa: RUF012 (Litestar reads these class attributes)
    guards = [require_admin]  # noqa: RUF012
    security = [{SECURITY_SCHEME: []}]  # noqa: RUF012

    @get("/models/{model:str}", opt=needs(Role.VIEWER), responses=release_responses(401, 404, 503))
    async def get_model(self, request: Request[Any, Any, Any], model: FromPath[str]) -> ModelDetail:
        """One model with its versions (and their ready replicas) and route, at one generation."""
        with registry_errors():
            return await model_detail(state_of(request).registry, model_name(model))

    @get("/models/{model:str}/versions", opt=needs(Role.VIEWER), responses=release_responses(401, 404, 503))
    async def list_versions(self, request: Request[Any, Any, Any], model: FromPath[str]) -> VersionsView:
        """The model's versions, by name, with their states and ready replicas."""
        with registry_errors():
            detail = await model_detail(state_of(request).registry, model_name(model))
        return VersionsView(detail.generation, detail.model.versions)

    @get("/models/{model:str}/route", opt=needs(Role.VIEWER), responses=release_responses(401, 404, 503))
    async def get_route(self, request: Request[Any, Any, Any], model: FromPath[str]) -> RouteView:
        """The model's split over its versions in basis points (10 000 = 100%); null when not routed."""
        with registry_errors():
            detail = await model_detail(state_of(request).registry, model_name(model))
        return RouteView(detail.generation, detail.model.name, detail.model.route)

    @get("/audit", opt=needs(Role.VIEWER), responses=release_responses(400, 401, 503))
    async def audit(
        self,
        request: Request[Any, Any, Any],
        model: FromQuery[str | None] = None,
        limit: FromQuery[int] = 100,
    ) -> list[AuditView]:
        """The registry's newest changes, newest first (``model``: that model's only; ``limit`` at most
        1000): who changed what, when, before and after."""
        with registry_errors():
            entries = await state_of(request).registry.audit(min(limit, MAX_AUDIT_ROWS), model)
        return [audit_view(e) for e in entries]

    @post(
        "/models/{model:str}/versions",
        opt=needs(Role.RELEASE_MANAGER),
        responses=release_responses(400, 401, 403, 404, 409, 503),
    )
    async def add_version(
        self, request: Request[Any, Any, Any], model: FromPath[str], data: JSONBody[AddVersionBody]
    ) -> VersionDetail:
        """Register a version of the model, ``staged`` (no replica loads it yet)."""
        name, registry = model_name(model), state_of(request).registry
        with registry_errors():
            await registry.add_version(
                name,
                data.version,
                artifact_uri=data.artifact_uri,
                weights_digest=data.weights_digest,
                build_config=data.build_config,
                actor=_actor(request),
            )
            detail = await _version_detail(registry, name, data.version)
        log.info("version %s@%s added by %s", name, data.version, _actor(request))
        return detail

    @post(
        "/models/{model:str}/versions/{version:str}/state",
        opt=needs(Role.RELEASE_MANAGER),
        status_code=200,
        responses=release_responses(400, 401, 403, 404, 503),
    )
    async def set_version_state(
        self,
        request: Request[Any, Any, Any],
        model: FromPath[str],
        version: FromPath[str],
        data: JSONBody[VersionStateBody],
    ) -> VersionDetail:
        """Move the version along its lifecycle (``warming`` so replicas load it, ``serving`` so a route may
        give it traffic, ``draining``, ``retired``); the registry's rules refuse the rest (400)."""
        name, registry = model_name(model), state_of(request).registry
        with registry_errors():
            await registry.set_version_state(name, version, data.state, actor=_actor(request))
            detail = await _version_detail(registry, name, version)
        log.info("version %s@%s set %s by %s", name, version, data.state, _actor(request))
        return detail

    @put(
        "/models/{model:str}/route",
        opt=needs(Role.RELEASE_MANAGER),
        responses=release_responses(400, 401, 403, 404, 503),
    )
    async def set_route(
        self, request: Request[Any, Any, Any], model: FromPath[str], data: JSONBody[RouteBody]
    ) -> RouteView:
        """Replace the model's split in one write, with ``version_states`` changed in the same write (a
        manual rollback: ``{"weights_bp": {"v1": 10000}, "version_states": {"v1": "serving", "v2":
        "draining"}}``). Refused while a rollout of the model is active: move the rollout instead."""
        name, registry = model_name(model), state_of(request).registry
        with registry_errors():
            await registry.set_route(
                name, data.weights_bp, actor=_actor(request), version_states=data.version_states
            )
            detail = await model_detail(registry, name)
        log.info("route of %s set to %s by %s", name, data.weights_bp, _actor(request))
        return RouteView(detail.generation, name, detail.model.route)


async def _version_detail(registry: Registry, model: str, version: str) -> VersionDetail:
    detail = await model_detail(registry, model)
    found = next(v for v in detail.model.versions if v.version == version)
    return VersionDetail(detail.generation, found)


# After models.RegistryController in the app's handlers (see create_model).
RELEASE_HANDLERS: list[type[Controller] | HTTPRouteHandler] = [ReleaseController, create_model]
