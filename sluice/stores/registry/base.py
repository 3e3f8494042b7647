"""The model registry's one interface, its types, errors and input rules; every backend passes one
contract suite (tests/registry/test_registry_contract.py).

What it holds: models; each model's versions (artifact URI, weights digest, build config, a state);
the replicas serving them (endpoint, the version loaded, a state, the last health report); and each
model's route, a weighted split over its versions in basis points (10 000 = 100%).

The generation rule: one counter for the whole registry, starting at 0. Every change bumps it by exactly
one, in the same transaction that writes the change and its audit row (who, when, what, before and
after), so a generation names one state of the registry. A refused change writes nothing and bumps
nothing. A call that changes nothing (a version set to the state it has, a health report that repeats
the replica's state) is not a change: no bump, no audit row. The one field outside the rule is a
replica's ``last_health_at`` (and its ``health_detail`` while its state holds): heartbeats refresh it in
place, because gateways route by states, not by the time of the last check.

Route rules (``sluice.stores.registry.changes``): a route names versions of its own model, every weight is a
whole number of basis points in [0, 10 000] and they sum to 10 000 with at least one positive; a version
with a positive weight must be ``serving``; a version named at weight 0 must not be retired. So a version
leaves ``serving`` only once the route gives it nothing — or in the same write as the route
(``set_route(..., version_states=...)``), which is how a rollback is one registry write.
"""

from __future__ import annotations

import builtins
import json
import math
import re
from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sluice.engine_limits import limits_of
from sluice.names import model_name_problem
from sluice.stores.registry.rollouts import (  # a route's weights sum to 10 000
    BASIS_POINTS_TOTAL,
    RolloutVerbs,
)


class VersionState(StrEnum):
    STAGED = "staged"  # registered, not loaded anywhere
    WARMING = "warming"  # replicas are loading it; takes no traffic
    SERVING = "serving"  # may be given traffic by the route
    DRAINING = "draining"  # the route gives it nothing; requests in flight finish
    RETIRED = "retired"  # gone for good


class ReplicaState(StrEnum):
    STARTING = "starting"
    READY = "ready"  # passes its health check: may take requests
    DRAINING = "draining"  # finishes what it holds, takes nothing new
    STOPPED = "stopped"
    FAILED = "failed"


class ReplicaPool(StrEnum):
    """Which requests a replica takes (gateway.routing): a version's replicas are split by workload shape."""

    GENERAL = "general"  # every request (the default)
    LONG_PROMPT = "long-prompt"  # prompts at or above the gateway's SLUICE_LONG_PROMPT_MIN_TOKENS
    WARM = "warm"  # loaded and verified, routed nothing: a reserve the autoscaler promotes (set_replica_pool)


# The version lifecycle. NOTE: draining -> serving is the rollback of a finished rollout; warming -> staged
# abandons a warm-up. A retired version never comes back: register a new version instead.
VERSION_TRANSITIONS: Mapping[VersionState, frozenset[VersionState]] = {
    VersionState.STAGED: frozenset({VersionState.WARMING, VersionState.RETIRED}),
    VersionState.WARMING: frozenset({VersionState.SERVING, VersionState.STAGED, VersionState.RETIRED}),
    VersionState.SERVING: frozenset({VersionState.DRAINING}),
    VersionState.DRAINING: frozenset({VersionState.SERVING, VersionState.RETIRED}),
    VersionState.RETIRED: frozenset(),
}

# A replica in one of these holds its version loaded: the version cannot be retired under it.
LIVE_REPLICA_STATES = frozenset({ReplicaState.STARTING, ReplicaState.READY, ReplicaState.DRAINING})


class ChangeAction(StrEnum):
    """What an audit row records."""

    MODEL_CREATE = "model.create"
    VERSION_ADD = "version.add"
    VERSION_STATE = "version.state"
    ROUTE_SET = "route.set"
    REPLICA_REGISTER = "replica.register"
    REPLICA_STATE = "replica.state"
    REPLICA_POOL = "replica.pool"
    REPLICA_REMOVE = "replica.remove"
    # A rollout's moves (sluice.stores.registry.rollouts): each changes the rollout, the route and versions'
    # states.
    ROLLOUT_START = "rollout.start"
    ROLLOUT_ADVANCE = "rollout.advance"
    ROLLOUT_COMPLETE = "rollout.complete"  # an advance (or a one-step start) that reached 100%
    ROLLOUT_PAUSE = "rollout.pause"
    ROLLOUT_RESUME = "rollout.resume"
    ROLLOUT_ROLLBACK = "rollout.rollback"


@dataclass(frozen=True)
class Model:
    name: str
    description: str
    created_at: datetime  # timezone-aware UTC, as every time here


@dataclass(frozen=True)
class ModelVersion:
    model: str
    version: str  # unique within its model
    artifact_uri: str  # where the weights (or the engine built from them) are: s3://..., file://...
    weights_digest: str  # "sha256:<64 hex>", as sluice.weights_digest computes it
    build_config: Mapping[str, Any]  # a JSON object: how the engine was built; read-only
    state: VersionState
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Replica:
    replica_id: str
    endpoint: str  # how a gateway reaches it, e.g. "10.0.0.7:8001" or "grpc://host:8001"
    model: str
    version: str  # the version it has loaded
    state: ReplicaState
    health_detail: str  # why, in words, when the last report said something ("" when nothing)
    last_health_at: datetime | None  # the last health report; None before the first
    registered_at: datetime
    updated_at: datetime  # the last change (not the last heartbeat)
    # Where its load is read (Triton's metrics endpoint, e.g. "http://10.0.0.7:8002/metrics"); "" unknown:
    # gateways then route to it without reading its load.
    metrics_url: str = ""
    pool: ReplicaPool = ReplicaPool.GENERAL  # which requests gateways route to it (warm: none)


@dataclass(frozen=True)
class RouteEntry:
    version: str
    weight_bp: int  # basis points of the model's traffic: 10 000 = all of it


@dataclass(frozen=True)
class Route:
    """A model's split over its versions: entries sorted by version name, weights summing to 10 000."""

    model: str
    entries: tuple[RouteEntry, ...]

    def weight_bp(self, version: str) -> int:
        """The version's weight; 0 when the route does not name it."""
        return next((e.weight_bp for e in self.entries if e.version == version), 0)

    def split_pct(self) -> dict[str, float]:
        """``{version: percent}``, the split ``sluice.policy.rollout.choose_version`` takes."""
        return {e.version: e.weight_bp / 100 for e in self.entries}


@dataclass(frozen=True)
class AuditEntry:
    """One change: the generation it made, who made it when, and the subject before and after it as JSON
    (``None`` before a creation and after a removal)."""

    generation: int
    at: datetime
    actor: str
    action: ChangeAction
    model: str
    subject: str  # "model", "version v2", "route", "replica r-7"
    before: Any
    after: Any


@dataclass(frozen=True)
class RegistrySnapshot:
    """Everything a gateway routes by, read in one transaction: the state named by ``generation``."""

    generation: int
    models: tuple[Model, ...]  # by name
    versions: tuple[ModelVersion, ...]  # by (model, version)
    replicas: tuple[Replica, ...]  # by replica_id
    routes: tuple[Route, ...]  # by model
    _routes_by_model: dict[str, Route] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_routes_by_model", {r.model: r for r in self.routes})

    def route(self, model: str) -> Route | None:
        return self._routes_by_model.get(model)

    def versions_of(self, model: str) -> builtins.list[ModelVersion]:
        return [v for v in self.versions if v.model == model]

    def replicas_of(
        self, model: str, version: str | None = None, state: ReplicaState | None = None
    ) -> builtins.list[Replica]:
        return [
            r
            for r in self.replicas
            if r.model == model
            and (version is None or r.version == version)
            and (state is None or r.state == state)
        ]


# ------------------------------------------------------------------------------------------------ errors


class RegistryError(Exception):
    """Base of the registry's own errors."""


class NotFound(RegistryError, LookupError):
    """The model, version or replica named is not in the registry."""


class AlreadyExists(RegistryError):
    """A model or version of that name is already registered (nothing was written)."""


class InvalidChange(RegistryError, ValueError):
    """Bad input (a name, a digest, weights) or a change the rules refuse (an illegal state transition, a
    route to a version that cannot serve): nothing was written, the generation did not move."""


class RegistryUnavailable(RegistryError, ConnectionError):
    """The registry cannot answer now (server down or unreachable, no connection within the pool's wait, a
    locked or unopenable file): nothing was read or written, and a later call may succeed. Every backend
    raises this for such failures instead of its driver's own types; any other error is a bug."""


# --------------------------------------------------------------------------------------- input rules

_VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_REPLICA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")
_ENDPOINT = re.compile(r"^\S{1,255}$")
# http(s)://host:port/path: the port and path always, as a Triton metrics endpoint has them (:8002/metrics).
_METRICS_URL = re.compile(
    r"https?://(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]):(?P<port>[0-9]{1,5})/[^\s#]{0,1000}"
)
MAX_ACTOR_CHARS = 200
MAX_TEXT_CHARS = 2000  # a description, a health detail


def _check(pattern: re.Pattern[str], what: str, value: object) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidChange(f"{what} must match {pattern.pattern}, got {value!r}")
    return value


def check_model_name(name: object) -> str:
    if (problem := model_name_problem(name)) is not None:
        raise InvalidChange(problem)
    assert isinstance(name, str)
    return name


def check_version_name(version: object) -> str:
    return _check(_VERSION_NAME, "version name", version)


def check_replica_id(replica_id: object) -> str:
    return _check(_REPLICA_ID, "replica_id", replica_id)


def check_digest(digest: object) -> str:
    return _check(_DIGEST, "weights_digest", digest)


def check_artifact_uri(uri: object) -> str:
    return _check(_URI, "artifact_uri (scheme://...)", uri)


def check_endpoint(endpoint: object) -> str:
    return _check(_ENDPOINT, "endpoint (no spaces)", endpoint)


def check_metrics_url(url: object) -> str:
    """A replica's metrics URL: ``http(s)://host:port/path`` (port 1..65535), or "" for none."""
    matched = _METRICS_URL.fullmatch(url) if isinstance(url, str) else None
    if url == "" or (matched is not None and 1 <= int(matched["port"]) <= 65535):
        return str(url)
    raise InvalidChange(f"metrics_url must be http(s)://host:port/path (port 1..65535) or empty, got {url!r}")


def check_actor(actor: object) -> str:
    """Who makes a change: a non-blank string of at most ``MAX_ACTOR_CHARS``."""
    if not isinstance(actor, str) or not actor.strip() or len(actor) > MAX_ACTOR_CHARS:
        raise InvalidChange(f"actor must be a non-blank string of at most {MAX_ACTOR_CHARS} chars: {actor!r}")
    return actor


def check_text(what: str, text: object) -> str:
    if not isinstance(text, str) or len(text) > MAX_TEXT_CHARS:
        raise InvalidChange(f"{what} must be a string of at most {MAX_TEXT_CHARS} chars")
    return text


def check_build_config(config: object) -> dict[str, Any]:
    """A JSON object (string keys, JSON values), returned as a fresh dict after a JSON round trip;
    ``engine_limits``, when present, as ``sluice.engine_limits`` reads it."""
    if not isinstance(config, Mapping) or not all(isinstance(k, str) for k in config):
        raise InvalidChange(f"build_config must be a mapping with string keys, got {type(config).__name__}")
    try:
        loaded: dict[str, Any] = json.loads(json.dumps(dict(config), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidChange(f"build_config must be JSON (no NaN or infinity): {exc}") from None
    try:
        limits_of(loaded)  # the engine limits gateways enforce must be whole, when recorded
    except ValueError as exc:
        raise InvalidChange(str(exc)) from None
    return loaded


def check_weights(weights_bp: object) -> tuple[RouteEntry, ...]:
    """A split as route entries sorted by version, or ``InvalidChange``: version names valid, each weight a
    whole number of basis points in [0, 10 000], summing to 10 000. (Which versions it may name is for
    ``sluice.stores.registry.changes``: that needs the registry's state.)"""
    if not isinstance(weights_bp, Mapping) or not weights_bp:
        raise InvalidChange("a route names at least one version, as {version: weight_bp}")
    entries = []
    for version, weight in sorted(weights_bp.items()):
        check_version_name(version)
        if not isinstance(weight, int) or isinstance(weight, bool) or not 0 <= weight <= BASIS_POINTS_TOTAL:
            raise InvalidChange(
                f"weight of version {version!r} must be whole basis points in [0, 10000], got {weight!r}"
            )
        entries.append(RouteEntry(version, weight))
    total = sum(e.weight_bp for e in entries)
    if total != BASIS_POINTS_TOTAL:
        raise InvalidChange(f"route weights must sum to 10000 basis points (100%), got {total}")
    return tuple(entries)


def weights_bp_from_pct(split_pct: Mapping[str, float]) -> dict[str, int]:
    """``{version: percent}`` (``sluice.policy.rollout``'s splits) as basis points; ``InvalidChange`` for a
    percentage that is not a whole number of basis points (33.333)."""
    weights = {}
    for version, pct in split_pct.items():
        bp = round(pct * 100) if isinstance(pct, int | float) and math.isfinite(pct) else None
        if bp is None or not math.isclose(bp, pct * 100, abs_tol=1e-6):
            raise InvalidChange(f"weight of version {version!r} must be a multiple of 0.01%, got {pct!r}")
        weights[version] = bp
    return weights


def check_limit(limit: object) -> int:
    """How many rows a read may return: a whole number >= 1."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidChange(f"limit must be a whole number >= 1, got {limit!r}")
    return limit


def check_transition(current: VersionState, new: VersionState, subject: str) -> None:
    if new not in VERSION_TRANSITIONS[current]:
        allowed = ", ".join(sorted(VERSION_TRANSITIONS[current])) or "none (terminal)"
        raise InvalidChange(f"{subject}: {current} -> {new} is not allowed; from {current}: {allowed}")


# ------------------------------------------------------------------------------------------ interface


class Registry(RolloutVerbs):
    """Every read returns frozen values; every mutation takes ``actor`` (who: a user, a service) and, when
    it changes something, bumps the generation by one and appends an audit row in the same transaction.
    Errors: ``NotFound``, ``AlreadyExists``, ``InvalidChange`` (nothing written), ``RegistryUnavailable``.
    The rollout verbs are in ``sluice.stores.registry.rollouts``."""

    @abstractmethod
    async def open(self) -> None:
        """Connect and apply pending schema migrations (idempotent)."""

    @abstractmethod
    async def close(self) -> None: ...

    # ---- models

    @abstractmethod
    async def create_model(self, name: str, *, actor: str, description: str = "") -> Model: ...

    @abstractmethod
    async def get_model(self, name: str) -> Model: ...

    @abstractmethod
    async def list_models(self) -> builtins.list[Model]:
        """By name."""

    # ---- versions

    @abstractmethod
    async def add_version(
        self,
        model: str,
        version: str,
        *,
        artifact_uri: str,
        weights_digest: str,
        build_config: Mapping[str, Any],
        actor: str,
    ) -> ModelVersion:
        """A new version, ``staged``. ``NotFound`` without the model, ``AlreadyExists`` for a version name
        the model has (retired ones included: a version name is never reused)."""

    @abstractmethod
    async def get_version(self, model: str, version: str) -> ModelVersion: ...

    @abstractmethod
    async def list_versions(self, model: str) -> builtins.list[ModelVersion]:
        """By version name; ``NotFound`` without the model."""

    @abstractmethod
    async def set_version_state(
        self, model: str, version: str, state: VersionState, *, actor: str
    ) -> ModelVersion:
        """Move along ``VERSION_TRANSITIONS`` (the same state: no change). Refused (``InvalidChange``):
        leaving ``serving`` while the route gives it weight, retiring it while the route names it or a live
        replica (``LIVE_REPLICA_STATES``) holds it."""

    # ---- routes

    @abstractmethod
    async def set_route(
        self,
        model: str,
        weights_bp: Mapping[str, int],
        *,
        actor: str,
        version_states: Mapping[str, VersionState] | None = None,
    ) -> Route:
        """Replace the model's whole split in one write; with ``version_states``, change those versions'
        states in the same write (one generation, one audit row): a rollback is
        ``set_route(m, {"v1": 10000}, version_states={"v1": SERVING, "v2": DRAINING})``. The route rules
        are in the module docstring; each state change follows ``set_version_state``'s rules. Refused
        (``InvalidChange``) while a rollout of the model is active: its moves own the route then."""

    @abstractmethod
    async def get_route(self, model: str) -> Route | None:
        """None while the model has no route (it is not served); ``NotFound`` without the model."""

    # ---- replicas

    @abstractmethod
    async def register_replica(
        self,
        replica_id: str,
        *,
        endpoint: str,
        model: str,
        version: str,
        actor: str,
        state: ReplicaState = ReplicaState.STARTING,
        detail: str = "",
        metrics_url: str = "",
        pool: ReplicaPool = ReplicaPool.GENERAL,
    ) -> Replica:
        """Insert the replica, or replace what it was registered as (a replica restarting, or loading another
        version), ``metrics_url`` and ``pool`` included ("" and general when not given): always a change.
        The version must exist and not be retired."""

    @abstractmethod
    async def set_replica_pool(self, replica_id: str, pool: ReplicaPool, *, actor: str) -> Replica:
        """Move the replica to ``pool`` in one write: how the autoscaler promotes a warm replica to general
        (gateways route to it from that generation on). The same pool: no change. ``NotFound`` without
        the replica, ``InvalidChange`` for an unknown pool."""

    @abstractmethod
    async def record_health(
        self, replica_id: str, state: ReplicaState, *, actor: str, detail: str = ""
    ) -> Replica:
        """A health report: sets ``last_health_at`` to now and ``health_detail``. A change (bump, audit row)
        only when ``state`` differs from the replica's; else the two fields are refreshed in place."""

    @abstractmethod
    async def get_replica(self, replica_id: str) -> Replica: ...

    @abstractmethod
    async def list_replicas(self, model: str | None = None) -> builtins.list[Replica]:
        """By replica_id; only ``model``'s when given."""

    @abstractmethod
    async def remove_replica(self, replica_id: str, *, actor: str) -> None: ...

    # ---- generation, snapshot, audit, change feed

    @abstractmethod
    async def generation(self) -> int:
        """The generation now: 0 for an empty registry, +1 per change since."""

    @abstractmethod
    async def snapshot(self) -> RegistrySnapshot:
        """Models, versions, replicas, routes and the generation, read in one transaction."""

    @abstractmethod
    async def audit(self, limit: int = 100, model: str | None = None) -> builtins.list[AuditEntry]:
        """The newest ``limit`` audit rows (of ``model`` only, when given), newest first."""

    @abstractmethod
    async def changes(self, after_generation: int, limit: int = 1000) -> builtins.list[AuditEntry]:
        """The audit rows of generations after ``after_generation``, oldest first, at most ``limit``: what a
        follower missed. Generations are committed in order, so nothing appears later below the last."""

    @abstractmethod
    async def wait_for_change(self, after_generation: int, timeout_s: float) -> int:
        """The generation, as soon as it exceeds ``after_generation`` (returned at once if it already does),
        or after ``timeout_s`` whatever it is. A change made through any registry object on the same
        database is seen within a second (PostgreSQL: LISTEN/NOTIFY, polling while the listening
        connection is lost; SQLite: polling)."""
