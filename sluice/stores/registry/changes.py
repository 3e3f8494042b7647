"""What each registry change does, decided once for both backends: pure functions from the state read
inside the change's transaction (and ``now``) to a ``Change``: the rows to write, the audit row's
subject with its before and after, and the value the call returns; or ``InvalidChange`` /
``AlreadyExists`` / ``NotFound`` with nothing written.

A backend's write is always: lock the generation row, read a ``ModelState``, call a ``plan_*`` function,
apply its writes, and if it is a change bump the generation and append the audit row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from sluice.stores.registry.base import (
    LIVE_REPLICA_STATES,
    AlreadyExists,
    ChangeAction,
    InvalidChange,
    Model,
    ModelVersion,
    NotFound,
    Replica,
    ReplicaPool,
    ReplicaState,
    Route,
    VersionState,
    check_artifact_uri,
    check_build_config,
    check_digest,
    check_endpoint,
    check_metrics_url,
    check_model_name,
    check_replica_id,
    check_text,
    check_transition,
    check_version_name,
    check_weights,
)
from sluice.stores.registry.rollouts import Rollout


@dataclass(frozen=True)
class ModelState:
    """One model as its change's transaction reads it. ``model`` None: no such model."""

    name: str
    model: Model | None
    versions: Mapping[str, ModelVersion] = field(default_factory=dict)
    route: Route | None = None
    replicas: Mapping[str, Replica] = field(default_factory=dict)  # the model's, by replica_id
    rollout: Rollout | None = None  # its latest rollout, active or finished

    def require_model(self) -> Model:
        if self.model is None:
            raise NotFound(f"no model {self.name!r}")
        return self.model

    def require_version(self, version: str) -> ModelVersion:
        self.require_model()
        found = self.versions.get(version)
        if found is None:
            raise NotFound(f"model {self.name!r} has no version {version!r}")
        return found


# The rows a change writes; each backend applies them in order.
@dataclass(frozen=True)
class PutModel:
    model: Model


@dataclass(frozen=True)
class PutVersion:
    version: ModelVersion  # insert, or replace the row of (model, version)


@dataclass(frozen=True)
class PutRoute:
    route: Route  # replaces every route row of the model


@dataclass(frozen=True)
class PutReplica:
    replica: Replica  # insert, or replace the row of replica_id


@dataclass(frozen=True)
class DeleteReplica:
    replica_id: str


@dataclass(frozen=True)
class PutRollout:
    rollout: Rollout  # insert, or replace the model's rollout row


Write = PutModel | PutVersion | PutRoute | PutReplica | DeleteReplica | PutRollout


R = TypeVar("R")


@dataclass(frozen=True)
class Change(Generic[R]):
    """``action`` None: not a change (nothing, or only a heartbeat's fields, written): no bump, no audit.
    ``result``: what the registry call returns."""

    action: ChangeAction | None
    model: str
    subject: str
    before: Any
    after: Any
    writes: tuple[Write, ...]
    result: R


def model_json(m: Model) -> dict[str, Any]:
    return {"name": m.name, "description": m.description}


def version_json(v: ModelVersion) -> dict[str, Any]:
    return {
        "version": v.version,
        "artifact_uri": v.artifact_uri,
        "weights_digest": v.weights_digest,
        "build_config": dict(v.build_config),
        "state": str(v.state),
    }


def route_json(r: Route | None) -> dict[str, int] | None:
    return None if r is None else {e.version: e.weight_bp for e in r.entries}


def replica_json(r: Replica) -> dict[str, Any]:
    return {
        "endpoint": r.endpoint,
        "model": r.model,
        "version": r.version,
        "state": str(r.state),
        "health_detail": r.health_detail,
        "metrics_url": r.metrics_url,
        "pool": str(r.pool),
    }


def _enum(kind: type[VersionState] | type[ReplicaState] | type[ReplicaPool], value: object) -> Any:
    try:
        return kind(str(value))
    except ValueError:
        raise InvalidChange(f"unknown {kind.__name__} {value!r}; valid: {', '.join(kind)}") from None


# ---------------------------------------------------------------------------------------------- models


def plan_create_model(state: ModelState, description: str, now: datetime) -> Change[Model]:
    check_model_name(state.name)
    check_text("description", description)
    if state.model is not None:
        raise AlreadyExists(f"model {state.name!r} already exists")
    model = Model(state.name, description, now)
    return Change(
        ChangeAction.MODEL_CREATE, model.name, "model", None, model_json(model), (PutModel(model),), model
    )


# -------------------------------------------------------------------------------------------- versions


def plan_add_version(
    state: ModelState,
    version: str,
    *,
    artifact_uri: str,
    weights_digest: str,
    build_config: Mapping[str, Any],
    now: datetime,
) -> Change[ModelVersion]:
    check_version_name(version)
    check_artifact_uri(artifact_uri)
    check_digest(weights_digest)
    config = check_build_config(build_config)
    state.require_model()
    if version in state.versions:
        raise AlreadyExists(f"model {state.name!r} already has a version {version!r}")
    new = ModelVersion(
        state.name, version, artifact_uri, weights_digest, config, VersionState.STAGED, now, now
    )
    return Change(
        ChangeAction.VERSION_ADD,
        state.name,
        f"version {version}",
        None,
        version_json(new),
        (PutVersion(new),),
        new,
    )


def _check_leaving(state: ModelState, version: str, new: VersionState, route: Route | None) -> None:
    """The rules a version's state change must keep against ``route`` (the route it will have) and the
    model's replicas."""
    subject = f"{state.name}@{version}"
    if new != VersionState.SERVING and route is not None and route.weight_bp(version) > 0:
        raise InvalidChange(
            f"{subject}: the route gives it {route.weight_bp(version)} bp; it must be serving"
        )
    if new == VersionState.RETIRED:
        if route is not None and any(e.version == version for e in route.entries):
            raise InvalidChange(f"{subject}: the route names it; a retired version cannot be routed")
        live = sorted(
            r.replica_id
            for r in state.replicas.values()
            if r.version == version and r.state in LIVE_REPLICA_STATES
        )
        if live:
            raise InvalidChange(f"{subject}: live replicas hold it ({', '.join(live)}); stop or remove them")


def plan_version_state(
    state: ModelState, version: str, new_state: object, now: datetime
) -> Change[ModelVersion]:
    new = _enum(VersionState, new_state)
    current = state.require_version(version)
    if current.state == new:
        return Change(None, state.name, f"version {version}", None, None, (), current)
    check_transition(current.state, new, f"{state.name}@{version}")
    _check_leaving(state, version, new, state.route)
    updated = dataclasses.replace(current, state=new, updated_at=now)
    return Change(
        ChangeAction.VERSION_STATE,
        state.name,
        f"version {version}",
        version_json(current),
        version_json(updated),
        (PutVersion(updated),),
        updated,
    )


# ---------------------------------------------------------------------------------------------- routes


def plan_route(
    state: ModelState,
    weights_bp: Mapping[str, int],
    version_states: Mapping[str, object] | None,
    now: datetime,
) -> Change[Route]:
    """A person's route change: ``route_change``, refused while a rollout of the model is active (its
    moves own the route then: ``sluice.stores.registry.rollouts``)."""
    route = route_change(state, weights_bp, version_states, now)
    rollout = state.rollout
    if rollout is not None and rollout.is_active:
        raise InvalidChange(
            f"model {state.name!r} has a {rollout.state} rollout ({rollout.stable_version} -> "
            f"{rollout.canary_version}): advance, pause or roll it back instead of setting its route"
        )
    return route


def route_change(
    state: ModelState,
    weights_bp: Mapping[str, int],
    version_states: Mapping[str, object] | None,
    now: datetime,
) -> Change[Route]:
    """The route rules of ``sluice.stores.registry.base``, checked against the versions' states after
    ``version_states`` is applied; each of those follows ``plan_version_state``'s rules."""
    route = Route(state.name, check_weights(weights_bp))
    state.require_model()
    named = [e.version for e in route.entries] + list(version_states or {})
    unknown = sorted({v for v in named if v not in state.versions})
    if unknown:
        raise InvalidChange(f"model {state.name!r} has no version(s) {', '.join(unknown)}")
    updated: dict[str, ModelVersion] = {}
    for version, new_state in sorted((version_states or {}).items()):
        new = _enum(VersionState, new_state)
        current = state.versions[version]
        if current.state != new:
            check_transition(current.state, new, f"{state.name}@{version}")
            _check_leaving(state, version, new, route)
            updated[version] = dataclasses.replace(current, state=new, updated_at=now)
    for entry in route.entries:
        routed = updated.get(entry.version) or state.versions[entry.version]
        if entry.weight_bp > 0 and routed.state != VersionState.SERVING:
            raise InvalidChange(
                f"{state.name}@{entry.version} is {routed.state}: only a serving version may be given weight"
            )
        if routed.state == VersionState.RETIRED:
            raise InvalidChange(f"{state.name}@{entry.version} is retired: a route cannot name it")
    before: dict[str, Any] = {"route": route_json(state.route)}
    after: dict[str, Any] = {"route": route_json(route)}
    if updated:
        before["versions"] = {v: str(state.versions[v].state) for v in updated}
        after["versions"] = {v: str(u.state) for v, u in updated.items()}
    writes: tuple[Write, ...] = (*(PutVersion(u) for u in updated.values()), PutRoute(route))
    return Change(ChangeAction.ROUTE_SET, state.name, "route", before, after, writes, route)


# -------------------------------------------------------------------------------------------- replicas


def plan_register_replica(
    state: ModelState,
    existing: Replica | None,
    replica_id: str,
    *,
    endpoint: str,
    version: str,
    replica_state: object,
    detail: str,
    metrics_url: str,
    pool: object = ReplicaPool.GENERAL,
    now: datetime,
) -> Change[Replica]:
    check_replica_id(replica_id)
    check_endpoint(endpoint)
    check_metrics_url(metrics_url)
    check_text("detail", detail)
    new_state = _enum(ReplicaState, replica_state)
    new_pool = _enum(ReplicaPool, pool)
    loaded = state.require_version(version)
    if loaded.state == VersionState.RETIRED:
        raise InvalidChange(f"{state.name}@{version} is retired: no replica may load it")
    replica = Replica(
        replica_id=replica_id,
        endpoint=endpoint,
        model=state.name,
        version=version,
        state=new_state,
        health_detail=detail,
        last_health_at=now,
        registered_at=now,
        updated_at=now,
        metrics_url=metrics_url,
        pool=new_pool,
    )
    return Change(
        ChangeAction.REPLICA_REGISTER,
        state.name,
        f"replica {replica_id}",
        None if existing is None else replica_json(existing),
        replica_json(replica),
        (PutReplica(replica),),
        replica,
    )


def plan_health(replica: Replica, replica_state: object, detail: str, now: datetime) -> Change[Replica]:
    check_text("detail", detail)
    new_state = _enum(ReplicaState, replica_state)
    changed = new_state != replica.state
    updated = dataclasses.replace(
        replica,
        state=new_state,
        health_detail=detail,
        last_health_at=now,
        updated_at=now if changed else replica.updated_at,
    )
    action = ChangeAction.REPLICA_STATE if changed else None
    before, after = (replica_json(replica), replica_json(updated)) if changed else (None, None)
    return Change(
        action, replica.model, f"replica {replica.replica_id}", before, after, (PutReplica(updated),), updated
    )


def plan_replica_pool(replica: Replica, pool: object, now: datetime) -> Change[Replica]:
    """The replica in ``pool``; its state and health stay as they are. The same pool: not a change."""
    new_pool = _enum(ReplicaPool, pool)
    subject = f"replica {replica.replica_id}"
    if new_pool == replica.pool:
        return Change(None, replica.model, subject, None, None, (), replica)
    updated = dataclasses.replace(replica, pool=new_pool, updated_at=now)
    return Change(
        ChangeAction.REPLICA_POOL,
        replica.model,
        subject,
        replica_json(replica),
        replica_json(updated),
        (PutReplica(updated),),
        updated,
    )


def plan_remove_replica(replica: Replica) -> Change[None]:
    return Change(
        ChangeAction.REPLICA_REMOVE,
        replica.model,
        f"replica {replica.replica_id}",
        replica_json(replica),
        None,
        (DeleteReplica(replica.replica_id),),
        None,
    )
