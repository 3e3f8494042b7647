"""``/admin/v1/replicas``: the replicas serving the registry's versions, and the local actuator.

- ``GET /replicas`` (viewer): every registered replica (``?model=`` for one model's), with its state,
  last health report, metrics URL (where gateways read its load; "" unknown), whether this control
  plane started it (``local``) and, for those, its cold start so far (``cold_start``: each phase's
  seconds, the bytes downloaded into the weight cache).
- ``POST /replicas`` (release-manager) ``{model, version, count, checkpoint?, pool?}``: start ``count``
  local tritonserver replicas of the version (``replicas.local_replicas``); 202 with them
  ``starting``; each turns ``ready`` once loaded and verified, or ``failed`` with the reason.
- ``PUT /replicas/{replica_id}`` (release-manager) ``{endpoint, model, version, metrics_url?, pool?}``:
  register a replica started elsewhere (its Triton gRPC address, and its Triton metrics URL for gateways to
  read its load: without one they route to it blind); checked at once, then by every health round.
- ``POST /replicas/{replica_id}/pool`` (release-manager) ``{pool}``: move it to another pool in one
  registry write (``general``, ``long-prompt``, ``warm``: see ``sluice.stores.registry.base.ReplicaPool``);
  promoting a warm replica to ``general`` puts it in rotation.
- ``POST /replicas/{replica_id}/drain`` (release-manager): gateways send it nothing new.
- ``POST /replicas/{replica_id}/stop`` (release-manager) ``{timeout_s?, wait?}``: drain, wait until it
  holds no request (or the timeout), stop its process, remove it; only for local replicas (409
  otherwise). ``wait: false`` answers once it is draining (a client with a short HTTP timeout polls the
  list until it is gone).
- ``DELETE /replicas/{replica_id}`` (release-manager): remove an external replica from the registry.

Release-manager, not platform-admin: a rollout needs replicas of its new version, and whoever rolls out
must be able to start and stop them. Every change is logged and audited in the registry with the token's
name as the actor.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
from litestar import Controller, Request, delete, get, post, put
from litestar.openapi import ResponseSpec
from litestar.params import FromPath, FromQuery, JSONBody

from control_plane.service.auth import SECURITY_SCHEME, needs, principal_of, require_admin
from control_plane.service.errors import AdminError, ErrorBody, unavailable
from control_plane.service.metrics import ControlPlaneMetrics
from control_plane.service.state import ReplicaServices, state_of
from replicas.health import HealthChecker, ReplicaStates
from replicas.local_replicas import (
    DEFAULT_STOP_TIMEOUT_S,
    MAX_REPLICAS_PER_START,
    InvalidReplicaRequest,
    LocalReplicas,
    ReplicaConflict,
)
from sluice.settings import Settings
from sluice.stores.admin_tokens.roles import Role
from sluice.stores.registry.base import (
    InvalidChange,
    NotFound,
    Registry,
    RegistryError,
    RegistryUnavailable,
    Replica,
    ReplicaPool,
    ReplicaState,
)
from sluice.weight_store import WeightStore


async def open_replica_services(
    settings: Settings,
    registry: Registry,
    metrics: ControlPlaneMetrics,
    stack: AsyncExitStack,
    *,
    health_interval_s: float | None = None,  # None: settings.replica_health_interval_s
) -> ReplicaServices:
    """The health checks (a background task) and the local actuator, closed by ``stack`` (the actuator's
    replicas stop with the service)."""
    states = ReplicaStates(registry)
    local = LocalReplicas(
        states, settings.state_dir, engine_dtype=settings.engine_dtype,
        weight_store=partial(WeightStore.from_settings, settings, quiet=True),
    )  # fmt: skip
    await local.open()
    stack.push_async_callback(local.close)
    health = HealthChecker(
        states,
        metrics.registry,
        interval_s=settings.replica_health_interval_s if health_interval_s is None else health_interval_s,
        start_grace_s=settings.replica_start_grace_s,
        probe_timeout_s=settings.replica_probe_timeout_s,
        launch_failed=local.launch_owns_state,
    )
    await health.start()
    stack.push_async_callback(health.close)
    return ReplicaServices(states=states, health=health, local=local)


# ---------------------------------------------------------------------------------------- schemas


class ReplicaView(msgspec.Struct):
    replica_id: str
    endpoint: str  # the Triton gRPC address gateways send to
    metrics_url: str  # where gateways read its load (its Triton metrics); "" unknown: not read
    model: str
    version: str
    state: ReplicaState
    pool: ReplicaPool  # which requests gateways route to it (warm: none)
    health_detail: str  # why, in words, when the last report said something
    last_health_at: datetime | None
    registered_at: datetime
    updated_at: datetime
    local: bool  # started (and owned) by this control plane
    # A local replica's start (replicas.replica_weights.ColdStart): phase, download_s,
    # num_downloaded_bytes, num_downloaded_files, verify_s, load_s, first_token_s, total_s; None otherwise.
    cold_start: dict[str, Any] | None = None


class ReplicaList(msgspec.Struct):
    replicas: list[ReplicaView]  # by replica_id


class StartReplicasBody(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    version: str  # a registered version whose name is a positive integer (Triton's version)
    count: int = 1  # 1..MAX_REPLICAS_PER_START
    checkpoint: str | None = None  # a folder on the control plane's machine; default the version's artifact
    pool: ReplicaPool = ReplicaPool.GENERAL  # the pool they join (warm: loaded, routed nothing)


class RegisterReplicaBody(msgspec.Struct, forbid_unknown_fields=True):
    endpoint: str  # host:port of its Triton gRPC service
    model: str
    version: str
    metrics_url: str = ""  # http(s)://host:port/path of its Triton metrics; "" none (its load is not read)
    pool: ReplicaPool = ReplicaPool.GENERAL


class ReplicaPoolBody(msgspec.Struct, forbid_unknown_fields=True):
    pool: ReplicaPool


class StopReplicaBody(msgspec.Struct, forbid_unknown_fields=True):
    timeout_s: float = DEFAULT_STOP_TIMEOUT_S  # how long to wait for its requests in flight
    wait: bool = True  # false: answer once it is draining; it is removed from the list once stopped


class StoppedReplica(msgspec.Struct):
    replica_id: str
    state: ReplicaState  # stopped (and removed from the registry); draining when not waited for
    waited_s: float | None  # None when not waited for
    num_in_flight_left: int | None  # requests still on it when it was stopped (None: unknown)


def replica_view(replica: Replica, services: ReplicaServices) -> ReplicaView:
    return ReplicaView(
        replica_id=replica.replica_id,
        endpoint=replica.endpoint,
        metrics_url=replica.metrics_url,
        model=replica.model,
        version=replica.version,
        state=replica.state,
        pool=replica.pool,
        health_detail=replica.health_detail,
        last_health_at=replica.last_health_at,
        registered_at=replica.registered_at,
        updated_at=replica.updated_at,
        local=services.local.is_local(replica.replica_id),
        cold_start=cold.as_dict() if (cold := services.local.cold_start(replica.replica_id)) else None,
    )


# ------------------------------------------------------------------------------------------ errors

_MEANINGS = {
    400: "Invalid body or a version that cannot be served here (`invalid_request_error`; `param` names it).",
    401: "`invalid_admin_token`: no admin token, an unknown or revoked one, or a tenant API key.",
    403: "`insufficient_role`: the token's role ranks below the one this operation needs.",
    404: "`not_found`: no such model, version or replica.",
    409: "`replica_conflict`: the replica's state or owner refuses this (the message says what to do).",
    503: "`registry_unavailable`: the model registry does not answer; with `Retry-After`.",
}


def _responses(*status_codes: int) -> dict[int, ResponseSpec]:
    return {
        code: ResponseSpec(data_container=ErrorBody, description=_MEANINGS[code], generate_examples=False)
        for code in status_codes
    }


def _admin_error(exc: Exception, param: str | None = None) -> AdminError:
    if isinstance(exc, NotFound):
        return AdminError(404, str(exc).strip("'\""), code="not_found")
    if isinstance(exc, ReplicaConflict):
        return AdminError(409, str(exc), code="replica_conflict")
    if isinstance(exc, InvalidReplicaRequest | InvalidChange):
        return AdminError(400, str(exc), param=param)
    if isinstance(exc, RegistryUnavailable):
        return unavailable("model registry", "registry_unavailable")
    raise exc


def _services(request: Request[Any, Any, Any]) -> ReplicaServices:
    return state_of(request).replicas


def _actor(request: Request[Any, Any, Any]) -> str:
    return principal_of(request).name


class ReplicasController(Controller):
    path = "/admin/v1/replicas"
    tags = ["Replicas"]  # noqa: RUF012 (Litestar reads these class attributes)
    guards = [require_admin]  # noqa: RUF012
    security = [{SECURITY_SCHEME: []}]  # noqa: RUF012

    @get("/", opt=needs(Role.VIEWER), responses=_responses(401, 503))
    async def list_replicas(
        self, request: Request[Any, Any, Any], model: FromQuery[str | None] = None
    ) -> ReplicaList:
        """Every registered replica (of ``model`` when given), by replica_id."""
        services = _services(request)
        try:
            replicas = await services.states.registry.list_replicas(model)
        except RegistryError as exc:
            raise _admin_error(exc) from exc
        return ReplicaList([replica_view(r, services) for r in replicas])

    @post(
        "/", opt=needs(Role.RELEASE_MANAGER), status_code=202, responses=_responses(400, 401, 403, 404, 503)
    )
    async def start_replicas(
        self, request: Request[Any, Any, Any], data: JSONBody[StartReplicasBody]
    ) -> ReplicaList:
        """Start local replicas of a version; they are ``starting`` until loaded and verified."""
        services = _services(request)
        checkpoint = Path(data.checkpoint) if data.checkpoint else None
        if checkpoint is not None and not checkpoint.is_absolute():
            raise AdminError(400, "checkpoint must be an absolute path on the control plane's machine",
                             param="checkpoint")  # fmt: skip
        if not 1 <= data.count <= MAX_REPLICAS_PER_START:
            raise AdminError(400, f"count must be in 1..{MAX_REPLICAS_PER_START}", param="count")
        try:
            started = await services.local.start(
                data.model, data.version, data.count, checkpoint, actor=_actor(request), pool=data.pool
            )
        except (RegistryError, InvalidReplicaRequest) as exc:
            raise _admin_error(exc) from exc
        return ReplicaList([replica_view(r, services) for r in started])

    @put(
        "/{replica_id:str}",
        opt=needs(Role.RELEASE_MANAGER),
        responses=_responses(400, 401, 403, 404, 409, 503),
    )
    async def register_replica(
        self, request: Request[Any, Any, Any], replica_id: FromPath[str], data: JSONBody[RegisterReplicaBody]
    ) -> ReplicaView:
        """Register (or re-register) a replica started elsewhere; the state its first check gave it."""
        services = _services(request)
        if services.local.is_local(replica_id):
            raise AdminError(
                409, f"replica {replica_id} was started by this control plane", code="replica_conflict"
            )
        try:
            replica = await services.states.register(
                replica_id, endpoint=data.endpoint, model=data.model, version=data.version,
                actor=_actor(request), state=ReplicaState.STARTING, detail="registered; not checked yet",
                metrics_url=data.metrics_url,
            )  # fmt: skip
            if data.pool != replica.pool:  # before its first check: it is starting, routed nothing yet
                replica = await services.states.registry.set_replica_pool(
                    replica_id, data.pool, actor=_actor(request)
                )
            checked = await services.health.check(replica)
        except RegistryError as exc:
            raise _admin_error(exc) from exc
        return replica_view(checked or replica, services)

    @post("/{replica_id:str}/pool", opt=needs(Role.RELEASE_MANAGER), status_code=200,
          responses=_responses(400, 401, 403, 404, 503))  # fmt: skip
    async def set_replica_pool(
        self, request: Request[Any, Any, Any], replica_id: FromPath[str], data: JSONBody[ReplicaPoolBody]
    ) -> ReplicaView:
        """Move the replica to another pool in one registry write (a warm one to general: in rotation)."""
        services = _services(request)
        try:
            replica = await services.states.registry.set_replica_pool(
                replica_id, data.pool, actor=_actor(request)
            )
        except RegistryError as exc:
            raise _admin_error(exc, param="pool") from exc
        return replica_view(replica, services)

    @post("/{replica_id:str}/drain", opt=needs(Role.RELEASE_MANAGER), status_code=200,
          responses=_responses(401, 403, 404, 409, 503))  # fmt: skip
    async def drain_replica(self, request: Request[Any, Any, Any], replica_id: FromPath[str]) -> ReplicaView:
        """Gateways send it nothing new; requests in flight finish."""
        services = _services(request)
        try:
            replica = await services.local.drain(replica_id, actor=_actor(request))
        except (RegistryError, ReplicaConflict) as exc:
            raise _admin_error(exc) from exc
        return replica_view(replica, services)

    @post("/{replica_id:str}/stop", opt=needs(Role.RELEASE_MANAGER), status_code=200,
          responses=_responses(400, 401, 403, 404, 409, 503))  # fmt: skip
    async def stop_replica(
        self,
        request: Request[Any, Any, Any],
        replica_id: FromPath[str],
        data: JSONBody[StopReplicaBody | None] = None,
    ) -> StoppedReplica:
        """Drain, wait for its requests (``timeout_s``), stop its process and remove it; with ``wait``
        false, answer once it is draining (it leaves the list once stopped)."""
        body = data or StopReplicaBody()
        if not 0 <= body.timeout_s <= 3600:
            raise AdminError(400, "timeout_s must be in [0, 3600]", param="timeout_s")
        try:
            report = await _services(request).local.stop(
                replica_id, actor=_actor(request), timeout_s=body.timeout_s, wait=body.wait
            )
        except (RegistryError, ReplicaConflict) as exc:
            raise _admin_error(exc) from exc
        if report is None:
            return StoppedReplica(replica_id, ReplicaState.DRAINING, None, None)
        return StoppedReplica(
            report.replica_id, ReplicaState.STOPPED, report.waited_s, report.num_in_flight_left
        )

    @delete("/{replica_id:str}", opt=needs(Role.RELEASE_MANAGER), status_code=204,
            responses=_responses(401, 403, 404, 409, 503))  # fmt: skip
    async def remove_replica(self, request: Request[Any, Any, Any], replica_id: FromPath[str]) -> None:
        """Remove a replica started elsewhere from the registry (409 for a local one: stop it)."""
        try:
            await _services(request).local.deregister(replica_id, actor=_actor(request))
        except (RegistryError, ReplicaConflict) as exc:
            raise _admin_error(exc) from exc
