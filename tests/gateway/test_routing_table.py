"""The routing table read off a registry snapshot: which replicas are routable, sticky choice, and the
fallback when a conversation's version has no replica."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.errors import OpenAIError
from gateway.metrics import GatewayMetrics
from gateway.routing.pools import ReplicaPools
from gateway.routing.router import Router
from gateway.routing.table import ReplicaTarget, RoutingTable
from replicas.verify import Verification
from sluice.domain import Tenant
from sluice.engine_client import EngineClient
from sluice.settings import Settings
from sluice.stores.registry.base import (
    Model,
    ModelVersion,
    RegistrySnapshot,
    Replica,
    ReplicaState,
    Route,
    RouteEntry,
    VersionState,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)
DIGEST = {"1": "sha256:" + "1" * 64, "2": "sha256:" + "2" * 64}
CONVERSATIONS = [f"conversation:{i}" for i in range(1_000)]


def _version(version: str, state: VersionState = VersionState.SERVING) -> ModelVersion:
    return ModelVersion("m", version, f"file:///ckpt/{version}", DIGEST[version], {}, state, NOW, NOW)


def _replica(replica_id: str, version: str, state: ReplicaState = ReplicaState.READY) -> Replica:
    return Replica(replica_id, f"127.0.0.1:{9000 + len(replica_id)}", "m", version, state, "", NOW, NOW, NOW)


def _snapshot(
    split_bp: dict[str, int], replicas: list[Replica], states: dict[str, VersionState] | None = None
) -> RegistrySnapshot:
    states = states or {}
    return RegistrySnapshot(
        generation=7,
        models=(Model("m", "", NOW),),
        versions=tuple(_version(v, states.get(v, VersionState.SERVING)) for v in sorted(DIGEST)),
        replicas=tuple(replicas),
        routes=(Route("m", tuple(RouteEntry(v, w) for v, w in sorted(split_bp.items()))),),
    )


def test_only_ready_replicas_of_serving_versions_are_routable() -> None:
    snapshot = _snapshot(
        {"1": 10_000, "2": 0},
        [_replica("a", "1"), _replica("b", "1", ReplicaState.STARTING), _replica("c", "2")],
        {"2": VersionState.DRAINING},
    )
    table = RoutingTable.from_snapshot(snapshot)
    assert table.generation == 7
    versions = table.models["m"].versions
    assert [r.replica_id for r in versions["1"].replicas] == ["a"]
    assert versions["1"].replicas[0].weights_digest == DIGEST["1"]  # what the replica must serve
    assert versions["2"].replicas == ()  # draining: no new requests
    assert set(table.replicas()) == {"a"}


def test_a_ten_percent_canary_gets_its_conversations_and_keeps_them() -> None:
    replicas = [_replica("a", "1"), _replica("bb", "2")]
    ten = RoutingTable.from_snapshot(_snapshot({"1": 9_000, "2": 1_000}, replicas))
    fifty = RoutingTable.from_snapshot(_snapshot({"1": 5_000, "2": 5_000}, replicas))
    at_ten = {c: ten.choose("m", "acme", c) for c in CONVERSATIONS}
    counts = Counter(choice.version for choice in at_ten.values() if choice is not None)
    assert 70 <= counts["2"] <= 130
    for conversation, choice in at_ten.items():
        assert choice is not None and choice.sticky
        if choice.version == "2":
            grown = fifty.choose("m", "acme", conversation)
            assert grown is not None and grown.version == "2"


def test_a_version_without_replicas_gives_its_conversations_to_the_others() -> None:
    table = RoutingTable.from_snapshot(_snapshot({"1": 5_000, "2": 5_000}, [_replica("a", "1")]))
    choices = [table.choose("m", "acme", c) for c in CONVERSATIONS]
    assert {c.version for c in choices if c is not None} == {"1"}
    assert 400 <= sum(1 for c in choices if c is not None and not c.sticky) <= 600


def test_no_routable_version_or_an_unknown_model_chooses_nothing() -> None:
    table = RoutingTable.from_snapshot(_snapshot({"1": 10_000}, [_replica("a", "1", ReplicaState.FAILED)]))
    assert table.choose("m", "acme", "x") is None
    assert table.choose("other", "acme", "x") is None


def test_every_routed_model_is_listed_for_the_tenants_that_may_use_it(tmp_path: Path) -> None:
    one = _snapshot({"1": 10_000}, [_replica("a", "1")])
    other = RegistrySnapshot(
        8,
        (*one.models, Model("other", "", NOW)),
        (
            *one.versions,
            ModelVersion("other", "1", "file:///o", DIGEST["1"], {}, VersionState.SERVING, NOW, NOW),
        ),
        one.replicas,
        (*one.routes, Route("other", (RouteEntry("1", 10_000),))),
    )
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
    router = Router(ReplicaPools(settings, GatewayMetrics(), _no_client, _no_verify), GatewayMetrics())
    router.table = RoutingTable.from_snapshot(other)
    assert router.models_for(Tenant("t", "T")) == ["m", "other"]
    assert router.models_for(Tenant("t", "T", allowed_models=frozenset({"other"}))) == ["other"]
    with pytest.raises(OpenAIError) as refused:
        router.route("m", Tenant("t", "T", allowed_models=frozenset({"other"})), "k")
    assert refused.value.status_code == 404


def _no_client(target: ReplicaTarget) -> EngineClient:
    raise AssertionError("no replica is contacted here")


async def _no_verify(target: ReplicaTarget) -> Verification:
    raise AssertionError("no replica is contacted here")
