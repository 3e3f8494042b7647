"""The model registry's contract, run over every backend (SQLite and PostgreSQL): every verb, the
generation rule (one bump per change, none for a refused or empty one), the audit log, the route rules and
the version lifecycle, and snapshots. The change feed, concurrency and outages: test_registry_feed.py."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sluice.stores.registry.base import (
    VERSION_TRANSITIONS,
    AlreadyExists,
    ChangeAction,
    InvalidChange,
    NotFound,
    Registry,
    ReplicaPool,
    ReplicaState,
    RouteEntry,
    VersionState,
)

pytestmark = pytest.mark.anyio

DIGEST = "sha256:" + "ab" * 32
R1_METRICS = "http://h1:8002/metrics"
S = VersionState


async def add(registry: Registry, version: str, model: str = "tiny", **kwargs: Any) -> None:
    options: dict[str, Any] = {
        "artifact_uri": f"s3://models/{model}/{version}",
        "weights_digest": DIGEST,
        "build_config": {"dtype": "bf16", "tp": 1},
        "actor": "alice",
    }
    await registry.add_version(model, version, **{**options, **kwargs})


async def serving(registry: Registry, version: str, model: str = "tiny") -> None:
    await add(registry, version, model)
    await registry.set_version_state(model, version, S.WARMING, actor="rollout")
    await registry.set_version_state(model, version, S.SERVING, actor="rollout")


async def test_models_are_created_read_and_listed(registry: Registry) -> None:
    assert await registry.generation() == 0 and await registry.list_models() == []
    created = await registry.create_model("tiny", actor="alice", description="the dev model")
    await registry.create_model("meta-llama/Llama-3.1-8B", actor="bob")
    assert created.name == "tiny" and created.description == "the dev model"
    assert abs(created.created_at - datetime.now(UTC)) < timedelta(seconds=30)
    assert await registry.get_model("tiny") == created
    assert [m.name for m in await registry.list_models()] == ["meta-llama/Llama-3.1-8B", "tiny"]
    with pytest.raises(AlreadyExists):
        await registry.create_model("tiny", actor="alice")
    with pytest.raises(NotFound):
        await registry.get_model("small")
    assert await registry.get_route("tiny") is None
    assert await registry.generation() == 2


async def test_versions_are_added_staged_and_read_back(registry: Registry) -> None:
    await registry.create_model("tiny", actor="alice")
    await add(registry, "v2")
    await add(registry, "v1", build_config={"nested": {"a": [1, 2.5, None, True]}})
    v1 = await registry.get_version("tiny", "v1")
    assert (v1.model, v1.version, v1.artifact_uri, v1.weights_digest) == (
        "tiny",
        "v1",
        "s3://models/tiny/v1",
        DIGEST,
    )
    assert v1.state == S.STAGED and v1.build_config == {"nested": {"a": [1, 2.5, None, True]}}
    assert v1.created_at == v1.updated_at
    assert [v.version for v in await registry.list_versions("tiny")] == ["v1", "v2"]
    with pytest.raises(AlreadyExists):
        await add(registry, "v1")
    with pytest.raises(NotFound):
        await add(registry, "v1", model="small")
    with pytest.raises(NotFound):
        await registry.get_version("tiny", "v3")
    with pytest.raises(NotFound):
        await registry.list_versions("small")


@pytest.mark.parametrize("start", list(VersionState))
async def test_version_transitions_follow_the_table(registry: Registry, start: VersionState) -> None:
    """From ``start``, every target state: allowed iff the table says so; the same state is no change."""
    path = {
        S.STAGED: [],
        S.WARMING: [S.WARMING],
        S.SERVING: [S.WARMING, S.SERVING],
        S.DRAINING: [S.WARMING, S.SERVING, S.DRAINING],
        S.RETIRED: [S.RETIRED],
    }
    await registry.create_model("tiny", actor="alice")
    for target in VersionState:
        version = f"{start}-to-{target}"
        await add(registry, version)
        for state in path[start]:
            await registry.set_version_state("tiny", version, state, actor="alice")
        before = await registry.generation()
        if target == start:
            assert (await registry.set_version_state("tiny", version, target, actor="a")).state == start
            assert await registry.generation() == before
        elif target in VERSION_TRANSITIONS[start]:
            moved = await registry.set_version_state("tiny", version, target, actor="alice")
            assert moved.state == target and moved.updated_at >= moved.created_at
            assert await registry.generation() == before + 1
        else:
            with pytest.raises(InvalidChange, match="not allowed"):
                await registry.set_version_state("tiny", version, target, actor="alice")
            assert await registry.generation() == before
            assert (await registry.get_version("tiny", version)).state == start


async def test_every_change_bumps_the_generation_by_one_and_is_audited(registry: Registry) -> None:
    await registry.create_model("tiny", actor="alice", description="d")
    await add(registry, "v1")
    await registry.set_version_state("tiny", "v1", S.WARMING, actor="rollout")
    await registry.set_version_state("tiny", "v1", S.SERVING, actor="rollout")
    await registry.set_route("tiny", {"v1": 10_000}, actor="bob")
    await registry.register_replica("r1", endpoint="10.0.0.7:8001", model="tiny", version="v1", actor="r1")
    await registry.record_health("r1", ReplicaState.READY, actor="health")
    await registry.remove_replica("r1", actor="carol")
    assert await registry.generation() == 8

    entries = await registry.audit()
    assert [e.generation for e in entries] == [8, 7, 6, 5, 4, 3, 2, 1]  # newest first
    assert [e.action for e in reversed(entries)] == [
        ChangeAction.MODEL_CREATE,
        ChangeAction.VERSION_ADD,
        ChangeAction.VERSION_STATE,
        ChangeAction.VERSION_STATE,
        ChangeAction.ROUTE_SET,
        ChangeAction.REPLICA_REGISTER,
        ChangeAction.REPLICA_STATE,
        ChangeAction.REPLICA_REMOVE,
    ]
    by_generation = {e.generation: e for e in entries}
    created = by_generation[1]
    assert (created.actor, created.model, created.subject) == ("alice", "tiny", "model")
    assert created.before is None and created.after == {"name": "tiny", "description": "d"}
    assert abs(created.at - datetime.now(UTC)) < timedelta(seconds=30)
    assert by_generation[2].after["build_config"] == {"dtype": "bf16", "tp": 1}
    warming = by_generation[3]
    assert (warming.subject, warming.before["state"], warming.after["state"]) == (
        "version v1",
        "staged",
        "warming",
    )
    assert by_generation[5].before == {"route": None} and by_generation[5].after == {"route": {"v1": 10_000}}
    health = by_generation[7]
    assert (health.actor, health.before["state"], health.after["state"]) == ("health", "starting", "ready")
    removed = by_generation[8]
    assert removed.before["endpoint"] == "10.0.0.7:8001" and removed.after is None
    assert [e.generation for e in await registry.audit(limit=2)] == [8, 7]


async def test_audit_filters_by_model_and_changes_reads_oldest_first(registry: Registry) -> None:
    await registry.create_model("tiny", actor="a")
    await registry.create_model("small", actor="a")
    await add(registry, "v1", model="small")
    await add(registry, "v1", model="tiny")
    assert [e.generation for e in await registry.audit(model="small")] == [3, 2]
    assert [e.generation for e in await registry.changes(after_generation=1)] == [2, 3, 4]
    assert [e.generation for e in await registry.changes(after_generation=1, limit=2)] == [2, 3]
    assert await registry.changes(after_generation=4) == []
    with pytest.raises(InvalidChange):
        await registry.audit(limit=0)


async def test_routes_split_in_basis_points_and_a_rollback_is_one_write(registry: Registry) -> None:
    await registry.create_model("tiny", actor="alice")
    await serving(registry, "v1")
    await serving(registry, "v2")
    route = await registry.set_route("tiny", {"v2": 1_000, "v1": 9_000}, actor="rollout")
    assert route.entries == (RouteEntry("v1", 9_000), RouteEntry("v2", 1_000))
    assert route.split_pct() == {"v1": 90.0, "v2": 10.0} and route.weight_bp("v3") == 0
    assert await registry.get_route("tiny") == route
    await registry.set_route("tiny", {"v2": 10_000}, actor="rollout")
    await registry.set_version_state("tiny", "v1", S.DRAINING, actor="rollout")

    # The rollback: v1 back to serving and all traffic, v2 draining, in one write.
    before = await registry.generation()
    await registry.set_route(
        "tiny", {"v1": 10_000}, actor="oncall", version_states={"v1": S.SERVING, "v2": S.DRAINING}
    )
    assert await registry.generation() == before + 1
    assert (await registry.get_version("tiny", "v1")).state == S.SERVING
    assert (await registry.get_version("tiny", "v2")).state == S.DRAINING
    (entry,) = await registry.audit(limit=1)
    assert (entry.action, entry.actor) == (ChangeAction.ROUTE_SET, "oncall")
    assert entry.before == {"route": {"v2": 10_000}, "versions": {"v1": "draining", "v2": "serving"}}
    assert entry.after == {"route": {"v1": 10_000}, "versions": {"v1": "serving", "v2": "draining"}}
    # A version at weight 0 may stay named while it is not retired.
    await registry.set_route("tiny", {"v1": 10_000, "v2": 0}, actor="rollout")


async def test_replicas_register_report_health_and_are_removed(registry: Registry) -> None:
    await registry.create_model("tiny", actor="alice")
    await serving(registry, "v1")
    await serving(registry, "v2")
    r1 = await registry.register_replica(
        "r1", endpoint="h1:8001", model="tiny", version="v1", actor="r1", metrics_url=R1_METRICS
    )
    assert (r1.state, r1.health_detail, r1.version, r1.metrics_url) == (
        ReplicaState.STARTING,
        "",
        "v1",
        R1_METRICS,
    )
    assert await registry.get_replica("r1") == r1
    (registered,) = await registry.audit(limit=1)
    assert registered.before is None and registered.after["metrics_url"] == R1_METRICS
    await registry.register_replica(
        "r2", endpoint="h2:8001", model="tiny", version="v1", actor="r2", state=ReplicaState.READY
    )
    before = await registry.generation()

    ready = await registry.record_health("r1", ReplicaState.READY, actor="health", detail="ok")
    assert ready.state == ReplicaState.READY and await registry.generation() == before + 1
    assert ready.last_health_at is not None and r1.last_health_at is not None
    # A heartbeat that repeats the state: the time and detail are refreshed, nothing else moves.
    await asyncio.sleep(0.01)
    beat = await registry.record_health("r1", ReplicaState.READY, actor="health", detail="ok, 3 queued")
    assert await registry.generation() == before + 1
    assert beat.last_health_at is not None and beat.last_health_at > ready.last_health_at
    assert beat.health_detail == "ok, 3 queued" and beat.updated_at == ready.updated_at
    assert await registry.get_replica("r1") == beat and beat.metrics_url == R1_METRICS

    # Registering again replaces the registration (a restart on another version), metrics URL included.
    moved = await registry.register_replica(
        "r1", endpoint="h1:8002", model="tiny", version="v2", actor="r1", metrics_url="https://h1:9443/m"
    )
    assert (moved.endpoint, moved.version, moved.state) == ("h1:8002", "v2", ReplicaState.STARTING)
    assert (await registry.get_replica("r1")).metrics_url == "https://h1:9443/m"
    (entry,) = await registry.audit(limit=1)
    assert entry.before["version"] == "v1" and entry.after["version"] == "v2"
    assert (entry.before["metrics_url"], entry.after["metrics_url"]) == (R1_METRICS, "https://h1:9443/m")
    # Not given: the new registration has none (it replaces, it does not merge).
    unknown = await registry.register_replica(
        "r1", endpoint="h1:8002", model="tiny", version="v2", actor="r1"
    )
    assert unknown.metrics_url == "" and (await registry.get_replica("r1")).metrics_url == ""
    (entry,) = await registry.audit(limit=1)
    assert (entry.before["metrics_url"], entry.after["metrics_url"]) == ("https://h1:9443/m", "")
    assert [r.replica_id for r in await registry.list_replicas()] == ["r1", "r2"]
    assert [r.replica_id for r in await registry.list_replicas("other")] == []
    await registry.remove_replica("r2", actor="carol")
    assert [r.replica_id for r in await registry.list_replicas("tiny")] == ["r1"]
    for call in (
        lambda: registry.remove_replica("r2", actor="carol"),
        lambda: registry.record_health("r9", ReplicaState.READY, actor="health"),
        lambda: registry.get_replica("r9"),
        lambda: registry.register_replica("r3", endpoint="h", model="tiny", version="v9", actor="r3"),
    ):
        with pytest.raises(NotFound):
            await call()


async def test_a_replicas_pool_is_registered_and_changed_in_one_write(registry: Registry) -> None:
    await registry.create_model("tiny", actor="alice")
    await serving(registry, "v1")
    general = await registry.register_replica("r1", endpoint="h1:1", model="tiny", version="v1", actor="a")
    assert general.pool == ReplicaPool.GENERAL  # the default
    warm = await registry.register_replica(
        "r2", endpoint="h2:1", model="tiny", version="v1", actor="a", state=ReplicaState.READY,
        pool=ReplicaPool.WARM,
    )  # fmt: skip
    (registered,) = await registry.audit(limit=1)
    assert registered.after["pool"] == "warm" and warm.pool == ReplicaPool.WARM

    # The autoscaler's promotion: one write, one generation, one audit row; state and health kept.
    before = await registry.generation()
    promoted = await registry.set_replica_pool("r2", ReplicaPool.GENERAL, actor="autoscaler")
    assert await registry.generation() == before + 1
    assert (promoted.pool, promoted.state, promoted.endpoint) == (
        ReplicaPool.GENERAL,
        ReplicaState.READY,
        "h2:1",
    )
    assert promoted.updated_at > warm.updated_at and promoted.last_health_at == warm.last_health_at
    assert await registry.get_replica("r2") == promoted
    assert (await registry.snapshot()).replicas[1].pool == ReplicaPool.GENERAL
    (entry,) = await registry.audit(limit=1)
    assert (entry.action, entry.actor, entry.subject) == (
        ChangeAction.REPLICA_POOL,
        "autoscaler",
        "replica r2",
    )
    assert (entry.before["pool"], entry.after["pool"]) == ("warm", "general")

    # The same pool again: not a change.
    assert await registry.set_replica_pool("r2", ReplicaPool.GENERAL, actor="autoscaler") == promoted
    assert await registry.generation() == before + 1
    # A health report keeps the pool; registering again replaces it (general when not given).
    await registry.set_replica_pool("r1", ReplicaPool.LONG_PROMPT, actor="oncall")
    ready = await registry.record_health("r1", ReplicaState.READY, actor="health")
    assert ready.pool == ReplicaPool.LONG_PROMPT
    again = await registry.register_replica("r1", endpoint="h1:1", model="tiny", version="v1", actor="a")
    assert again.pool == ReplicaPool.GENERAL
    with pytest.raises(NotFound):
        await registry.set_replica_pool("r9", ReplicaPool.GENERAL, actor="a")


async def test_snapshot_holds_everything_at_its_generation(registry: Registry) -> None:
    await registry.create_model("tiny", actor="alice")
    await registry.create_model("small", actor="alice")
    await serving(registry, "v1")
    await add(registry, "v1", model="small")
    await registry.set_route("tiny", {"v1": 10_000}, actor="rollout")
    await registry.register_replica(
        "r1", endpoint="h1:8001", model="tiny", version="v1", actor="r1", state=ReplicaState.READY,
        metrics_url=R1_METRICS,
    )  # fmt: skip
    snap = await registry.snapshot()
    assert snap.generation == await registry.generation() == 8
    assert [m.name for m in snap.models] == ["small", "tiny"]
    assert [(v.model, v.version, v.state) for v in snap.versions] == [
        ("small", "v1", S.STAGED),
        ("tiny", "v1", S.SERVING),
    ]
    assert snap.route("tiny") == await registry.get_route("tiny") and snap.route("small") is None
    assert [v.model for v in snap.versions_of("small")] == ["small"]
    assert [r.replica_id for r in snap.replicas_of("tiny", "v1", ReplicaState.READY)] == ["r1"]
    assert snap.replicas_of("tiny", state=ReplicaState.STARTING) == []
    assert snap.replicas == (await registry.get_replica("r1"),)
    assert snap.replicas[0].metrics_url == R1_METRICS


Call = Callable[[], Awaitable[Any]]


async def _refusals(registry: Registry) -> list[tuple[str, str, Call]]:
    """v1 serving and routed, v2 staged, v3 draining with a live replica, v4 retired; then one call per
    rule that must be refused: (what, the refusal's words, the call)."""
    await registry.create_model("tiny", actor="alice")
    await serving(registry, "v1")
    await add(registry, "v2")
    await serving(registry, "v3")
    await registry.set_version_state("tiny", "v3", S.DRAINING, actor="alice")
    await add(registry, "v4")
    await registry.set_version_state("tiny", "v4", S.RETIRED, actor="alice")
    await registry.set_route("tiny", {"v1": 10_000}, actor="rollout")
    await registry.register_replica("r1", endpoint="h1:1", model="tiny", version="v3", actor="r1")
    route, version, health = registry.set_route, registry.set_version_state, registry.record_health
    # Values of the wrong type, as an untyped caller (JSON from the admin API) could pass them.
    fractional: Any = {"v1": 9_999.5, "v2": 0.5}
    paused: Any = "paused"
    up: Any = "up"
    no_actor: Any = None
    return [
        (
            "unknown version in a route",
            "no version",
            lambda: route("tiny", {"v1": 5000, "v9": 5000}, actor="a"),
        ),
        ("weights under 100%", "sum to 10000", lambda: route("tiny", {"v1": 9_000}, actor="a")),
        ("weights over 100%", "sum to 10000", lambda: route("tiny", {"v1": 10_000, "v2": 10}, actor="a")),
        ("a negative weight", "basis points", lambda: route("tiny", {"v1": 10_001, "v2": -1}, actor="a")),
        ("a fractional weight", "basis points", lambda: route("tiny", fractional, actor="a")),
        ("an empty route", "at least one", lambda: route("tiny", {}, actor="a")),
        (
            "weight to a staged version",
            "is staged",
            lambda: route("tiny", {"v1": 5000, "v2": 5000}, actor="a"),
        ),
        ("weight to a draining version", "is draining", lambda: route("tiny", {"v3": 10_000}, actor="a")),
        ("a retired version named", "retired", lambda: route("tiny", {"v1": 10_000, "v4": 0}, actor="a")),
        ("a route for no model", "no model", lambda: route("small", {"v1": 10_000}, actor="a")),
        (
            "a state change the route contradicts",
            "must be serving",
            lambda: route("tiny", {"v1": 10_000}, actor="a", version_states={"v1": S.DRAINING}),
        ),
        (
            "an illegal transition inside a route write",
            "not allowed",
            lambda: route("tiny", {"v1": 10_000}, actor="a", version_states={"v2": S.SERVING}),
        ),
        ("a bad digest", "weights_digest", lambda: add(registry, "v5", weights_digest="sha256:" + "AB" * 32)),
        (
            "a digest without its algorithm",
            "weights_digest",
            lambda: add(registry, "v5", weights_digest="ab" * 32),
        ),
        (
            "an artifact URI without a scheme",
            "artifact_uri",
            lambda: add(registry, "v5", artifact_uri="models/v5"),
        ),
        (
            "a build config that is not JSON",
            "JSON",
            lambda: add(registry, "v5", build_config={"x": math.nan}),
        ),
        ("a bad version name", "version name", lambda: add(registry, "../v5")),
        ("a bad model name", "model name", lambda: registry.create_model(" tiny", actor="a")),
        ("an illegal transition", "not allowed", lambda: version("tiny", "v2", S.SERVING, actor="a")),
        (
            "an unknown state",
            "unknown VersionState",
            lambda: version("tiny", "v2", paused, actor="a"),
        ),
        ("a retired version revived", "not allowed", lambda: version("tiny", "v4", S.WARMING, actor="a")),
        (
            "draining a routed version",
            "must be serving",
            lambda: version("tiny", "v1", S.DRAINING, actor="a"),
        ),
        (
            "retiring a version a live replica holds",
            "live replicas",
            lambda: version("tiny", "v3", S.RETIRED, actor="a"),
        ),
        ("a replica on a retired version", "retired", lambda: _register(registry, "r2", "v4")),
        ("a replica on an unknown version", "no version", lambda: _register(registry, "r2", "v9")),
        ("a replica id with spaces", "replica_id", lambda: _register(registry, "r 2", "v1")),
        *(
            (f"a metrics URL {url!r}", "metrics_url", lambda url=url: _register(registry, "r2", "v1", url))
            for url in BAD_METRICS_URLS
        ),
        ("an unknown replica state", "unknown ReplicaState", lambda: health("r1", up, actor="h")),
        (
            "an unknown pool",
            "unknown ReplicaPool",
            lambda: registry.set_replica_pool("r1", paused, actor="a"),
        ),
        (
            "an unknown pool at registration",
            "unknown ReplicaPool",
            lambda: registry.register_replica(
                "r2", endpoint="h:1", model="tiny", version="v1", actor="a", pool=paused
            ),
        ),
        (
            "a pool change without an actor",
            "actor",
            lambda: registry.set_replica_pool("r1", ReplicaPool.WARM, actor=no_actor),
        ),
        ("a blank actor", "actor", lambda: registry.create_model("small", actor=" ")),
        ("no actor", "actor", lambda: registry.create_model("small", actor=no_actor)),
    ]


# No scheme, another scheme, no port, port 0 or over 65535, no path, spaces, a fragment, not a string.
BAD_METRICS_URLS: tuple[Any, ...] = (
    "h1:8002/metrics",
    "grpc://h1:8002/metrics",
    "http://h1/metrics",
    "http://h1:0/metrics",
    "http://h1:65536/metrics",
    "http://h1:8002",
    "http://h1:8002/me trics",
    "http://h1:8002/metrics\n",
    "http://h1:8002/metrics#x",
    None,
)


async def _register(registry: Registry, replica_id: str, version: str, metrics_url: Any = "") -> None:
    await registry.register_replica(
        replica_id, endpoint="h:1", model="tiny", version=version, actor="a", metrics_url=metrics_url
    )


async def test_refused_changes_write_nothing(registry: Registry) -> None:
    for what, words, call in await _refusals(registry):
        before, audit_before = await registry.snapshot(), await registry.audit(limit=1000)
        with pytest.raises((InvalidChange, NotFound), match=words):
            await call()
        assert await registry.snapshot() == before, what
        assert await registry.audit(limit=1000) == audit_before, what
