"""What a gateway routes by, read off one registry snapshot: per model, the route's split and, per
version in it, the replicas that may be sent requests. Pure: a snapshot in, a table out; a request's
identity in, a version out (``sluice.policy.rollout``).

A replica is routable when the registry says it is ``ready`` (the control plane's health check verified
it serves the version's weights digest) and it serves a version that is ``serving``; the gateway verifies
the digest again before its first request to it (``gateway.routing.pools``). A version in the route is
chosen by the sticky split; if the chosen version has no routable replica, the choice is made again
among the route's versions that have one (the same rendezvous with the others' weights at 0), so a
version without replicas moves only its own conversations, and the response names the version that
served it. No routable version at all: the model is unavailable (503), never served by other weights.

Pools by workload shape: each replica is in its registry pool. ``general`` and ``long-prompt`` replicas
are routable (each pool has its own queue, ``gateway.routing.pools``); ``warm`` ones never are, until the
registry moves them to another pool. Once the prompt is tokenized, ``choose_pool`` picks the pool: a
prompt of at least ``long_prompt_min_tokens`` goes to the long-prompt pool, a shorter one to the general
pool, so a short prompt never waits behind long prefills; a pool with no replica in rotation gives its
prompts to the other one (a fallback the caller counts), and neither: the model is unavailable.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from sluice.engine_client.dialects import Dialect, dialect_of
from sluice.engine_limits import EngineLimits, limits_of
from sluice.policy.rollout import bucket_of, version_for_bucket
from sluice.stores.registry.base import RegistrySnapshot, ReplicaPool, ReplicaState, VersionState
from sluice.tool_parsers import DEFAULT_PARSER, tool_call_parser_of

# The pools a gateway routes to; a warm replica is loaded but routed nothing.
ROUTED_POOLS = (ReplicaPool.GENERAL, ReplicaPool.LONG_PROMPT)


@dataclass(frozen=True)
class ReplicaTarget:
    replica_id: str
    endpoint: str
    model: str
    version: str
    weights_digest: str  # the registry's, for the version: what the replica must serve
    # Where its load is read ("": unknown, routed without). NOTE: part of the target's identity: a new
    # metrics URL is a changed target, drained and admitted again (``gateway.routing.pools``).
    metrics_url: str = ""
    pool: ReplicaPool = ReplicaPool.GENERAL  # which queue it serves; a new pool is a changed target too
    # The request dialect of the model it serves, from its version's build target (sluice.engine_client.
    # dialects): which tensors the gateway sends it.
    dialect: Dialect | None = Dialect.CPU_ENGINE  # None: the build target is unknown to this gateway


@dataclass(frozen=True)
class VersionTarget:
    model: str
    version: str
    weights_digest: str
    artifact_uri: str
    replicas: tuple[ReplicaTarget, ...]  # routable ones only (general and long-prompt pools)
    dialect: Dialect | None = Dialect.CPU_ENGINE  # as its replicas'
    # The engine's build limits (prompt, prompt + output), enforced before dispatch; None: the model's
    # own context bounds it (the CPU engine).
    limits: EngineLimits | None = None
    # How its answers are read for tool calls (build_config "tool_call_parser"); None: a parser this
    # gateway does not know (logged), the version serves no tools.
    tool_call_parser: str | None = DEFAULT_PARSER

    def pools(self) -> frozenset[ReplicaPool]:
        """The pools its routable replicas are in."""
        return frozenset(r.pool for r in self.replicas)


@dataclass(frozen=True)
class ModelRoutes:
    model: str
    split_pct: Mapping[str, float]  # the route, {version: percent}
    versions: Mapping[str, VersionTarget]  # every version the split names, with its routable replicas

    def routable_split(self) -> dict[str, float]:
        """The split with every version that has no routable replica at weight 0."""
        return {v: (w if self.versions[v].replicas else 0.0) for v, w in self.split_pct.items()}


@dataclass(frozen=True)
class Choice:
    version: str
    sticky: bool  # False: the conversation's own version had no replica, another served it


@dataclass(frozen=True)
class RoutingTable:
    generation: int  # the registry generation it was read from (-1: not from a registry)
    models: Mapping[str, ModelRoutes] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: RegistrySnapshot) -> RoutingTable:
        versions = {(v.model, v.version): v for v in snapshot.versions}
        models: dict[str, ModelRoutes] = {}
        for route in snapshot.routes:
            targets: dict[str, VersionTarget] = {}
            for entry in route.entries:
                version = versions.get((route.model, entry.version))
                if version is None:  # the registry's rules prevent it; a table must not crash on it
                    continue
                serving = version.state is VersionState.SERVING
                dialect = _dialect(version.build_config)
                replicas = tuple(
                    ReplicaTarget(
                        r.replica_id, r.endpoint, r.model, r.version, version.weights_digest, r.metrics_url,
                        r.pool, dialect,
                    )
                    for r in snapshot.replicas_of(route.model, entry.version, ReplicaState.READY)
                    if serving and r.pool in ROUTED_POOLS
                )  # fmt: skip
                limits, limits_ok = _limits(version.build_config)
                targets[entry.version] = VersionTarget(
                    route.model,
                    entry.version,
                    version.weights_digest,
                    version.artifact_uri,
                    replicas if limits_ok else (),
                    dialect,
                    limits,
                    tool_call_parser_of(version.build_config),
                )
            split = {v: w for v, w in route.split_pct().items() if v in targets}
            if split and any(w > 0 for w in split.values()):
                models[route.model] = ModelRoutes(route.model, split, targets)
        return cls(snapshot.generation, models)

    def choose(self, model: str, tenant_id: str, conversation_key: str) -> Choice | None:
        """The version a request of ``tenant_id`` in ``conversation_key`` goes to; None if the model has
        no routable version (or is not routed at all)."""
        routes = self.models.get(model)
        if routes is None:
            return None
        bucket = bucket_of(tenant_id, conversation_key)
        sticky = version_for_bucket(routes.split_pct, bucket)
        if routes.versions[sticky].replicas:
            return Choice(sticky, True)
        routable = routes.routable_split()
        if not any(w > 0 for w in routable.values()):
            return None
        total = sum(routable.values())
        return Choice(version_for_bucket({v: w * 100 / total for v, w in routable.items()}, bucket), False)

    def replicas(self) -> dict[str, ReplicaTarget]:
        """Every routable replica, by id."""
        return {
            r.replica_id: r for m in self.models.values() for v in m.versions.values() for r in v.replicas
        }


def _dialect(build_config: Mapping[str, object]) -> Dialect | None:
    """The version's dialect; None for a build target this gateway does not know (a newer control plane's):
    its replicas are kept out of rotation with the reason (``gateway.routing.pools``), the table still
    builds."""
    try:
        return dialect_of(build_config)
    except ValueError:
        return None


def _limits(build_config: Mapping[str, object]) -> tuple[EngineLimits | None, bool]:
    """The version's engine limits, and False when they are recorded but malformed: its replicas are
    then kept out of rotation (a request the engine would refuse must never reach it unchecked)."""
    try:
        return limits_of(build_config), True
    except ValueError:
        return None, False


@dataclass(frozen=True)
class PoolChoice:
    pool: ReplicaPool  # the pool whose queue takes the request
    wanted: ReplicaPool  # the pool its prompt's length asks for

    @property
    def is_fallback(self) -> bool:
        """The wanted pool had no replica in rotation: the other pool took it."""
        return self.pool != self.wanted


def choose_pool(
    num_prompt_tokens: int, long_prompt_min_tokens: int | None, in_rotation: Collection[ReplicaPool]
) -> PoolChoice | None:
    """The pool a prompt of ``num_prompt_tokens`` goes to, among the pools of its version that have a
    replica in rotation: long-prompt from ``long_prompt_min_tokens`` tokens (None: never), general below;
    the other routed pool when the wanted one has none; None when neither has one."""
    is_long = long_prompt_min_tokens is not None and num_prompt_tokens >= long_prompt_min_tokens
    wanted = ReplicaPool.LONG_PROMPT if is_long else ReplicaPool.GENERAL
    for pool in (wanted, *(p for p in ROUTED_POOLS if p != wanted)):
        if pool in in_rotation:
            return PoolChoice(pool, wanted)
    return None
