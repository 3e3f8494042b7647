"""``GET /admin/v1/models`` (viewer): the model registry as it stands, read-only, from one snapshot (every
model with its versions, its route and how many ready replicas serve each version, at one generation).
Changes go through later endpoints (release-manager)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec
from litestar import Controller, Request, get

from control_plane.service.auth import SECURITY_SCHEME, needs, require_admin
from control_plane.service.errors import error_responses, unavailable
from control_plane.service.state import state_of
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.registry.base import RegistrySnapshot, RegistryUnavailable, ReplicaState, VersionState


class VersionView(msgspec.Struct):
    version: str
    state: VersionState
    artifact_uri: str
    weights_digest: str
    build_config: dict[str, Any]
    num_ready_replicas: int
    created_at: datetime
    updated_at: datetime


class RouteEntryView(msgspec.Struct):
    version: str
    weight_bp: int  # basis points of the model's traffic: 10 000 = all of it


class ModelView(msgspec.Struct):
    name: str
    description: str
    created_at: datetime
    versions: list[VersionView]  # by version name
    route: list[RouteEntryView] | None  # None: the model is not routed (not served)


class ModelsView(msgspec.Struct):
    generation: int  # the registry state this listing shows
    models: list[ModelView]  # by name


def models_view(snapshot: RegistrySnapshot) -> ModelsView:
    models = []
    for model in snapshot.models:
        versions = [
            VersionView(
                version=v.version,
                state=v.state,
                artifact_uri=v.artifact_uri,
                weights_digest=v.weights_digest,
                build_config=dict(v.build_config),
                num_ready_replicas=len(snapshot.replicas_of(model.name, v.version, ReplicaState.READY)),
                created_at=v.created_at,
                updated_at=v.updated_at,
            )
            for v in snapshot.versions_of(model.name)
        ]
        route = snapshot.route(model.name)
        entries = None if route is None else [RouteEntryView(e.version, e.weight_bp) for e in route.entries]
        models.append(ModelView(model.name, model.description, model.created_at, versions, entries))
    return ModelsView(generation=snapshot.generation, models=models)


class RegistryController(Controller):
    path = "/admin/v1"
    tags = ["Registry"]  # noqa: RUF012 (Litestar reads these class attributes)
    guards = [require_admin]  # noqa: RUF012
    security = [{SECURITY_SCHEME: []}]  # noqa: RUF012

    @get("/models", opt=needs(Role.VIEWER), responses=error_responses(401, 503))
    async def list_models(self, request: Request[Any, Any, Any]) -> ModelsView:
        """Every registered model with its versions and route, at one registry generation."""
        try:
            snapshot = await state_of(request).registry.snapshot()
        except RegistryUnavailable as exc:
            raise unavailable("model registry", "registry_unavailable") from exc
        return models_view(snapshot)
