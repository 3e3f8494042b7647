"""A TensorRT-LLM version's engine build limits (recorded by sluice build-engine from the engine's own
config.json) are enforced by the gateway before dispatch: a prompt over max_input_len, or prompt +
max_tokens over max_seq_len, is a 400 context_length_exceeded, never the executor's INTERNAL error."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from gateway.errors import OpenAIError
from gateway.openai.admission import _check_engine_input, _context_tokens
from gateway.routing.table import RoutingTable
from sluice.engine_limits import EngineLimits, limits_of
from sluice.stores.registry.base import (
    InvalidChange,
    Model,
    ModelVersion,
    RegistrySnapshot,
    Replica,
    ReplicaState,
    Route,
    RouteEntry,
    VersionState,
    check_build_config,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)
LIMITS = {"max_input_len": 4096, "max_seq_len": 8192, "max_batch_size": 64, "max_num_tokens": 8192}


def _table(build_config: dict[str, object]) -> RoutingTable:
    version = ModelVersion(
        "m", "1", "file:///a", "sha256:" + "1" * 64, build_config, VersionState.SERVING, NOW, NOW
    )
    replica = Replica("r", "127.0.0.1:9001", "m", "1", ReplicaState.READY, "", NOW, NOW, NOW)
    snapshot = RegistrySnapshot(
        generation=1,
        models=(Model("m", "", NOW),),
        versions=(version,),
        replicas=(replica,),
        routes=(Route("m", (RouteEntry("1", 10_000),)),),
    )
    return RoutingTable.from_snapshot(snapshot)


def test_the_routing_table_carries_the_versions_engine_limits() -> None:
    target = _table({"target": "trtllm", "engine_limits": LIMITS}).models["m"].versions["1"]
    assert target.limits == EngineLimits(4096, 8192, 64, 8192)
    assert [r.replica_id for r in target.replicas] == ["r"]
    assert _table({"target": "cpu"}).models["m"].versions["1"].limits is None


def test_malformed_limits_keep_the_version_out_of_rotation_and_the_registry_refuses_them() -> None:
    bad = {"target": "trtllm", "engine_limits": {**LIMITS, "max_input_len": 0}}
    assert _table(bad).models["m"].versions["1"].replicas == ()
    with pytest.raises(InvalidChange, match="max_input_len must be a positive integer"):
        check_build_config(bad)
    with pytest.raises(ValueError, match="exceeds max_seq_len"):
        limits_of({"engine_limits": {**LIMITS, "max_input_len": 9000}})


def test_a_prompt_over_max_input_len_is_context_length_exceeded() -> None:
    limits = EngineLimits(**LIMITS)
    _check_engine_input(4096, limits, "messages")
    _check_engine_input(10**6, None, "messages")  # no engine limits: the model's context bounds it
    with pytest.raises(OpenAIError) as err:
        _check_engine_input(4097, limits, "messages")
    assert err.value.status_code == 400 and err.value.code == "context_length_exceeded"
    assert "maximum prompt length is 4096 tokens" in str(err.value)


@dataclass
class _Codec:
    max_context_tokens: int | None


@dataclass
class _Target:
    codec: _Codec
    limits: EngineLimits | None


def test_the_context_is_the_smaller_of_the_models_and_the_engines_max_seq_len() -> None:
    limits = EngineLimits(**LIMITS)
    # max_position_embeddings 131,072 but an engine built for 8,192: prompt + output stop at 8,192.
    assert _context_tokens(_Target(_Codec(131_072), limits), 4096) == 8192  # type: ignore[arg-type]
    assert _context_tokens(_Target(_Codec(2048), limits), 4096) == 2048  # type: ignore[arg-type]
    assert _context_tokens(_Target(_Codec(None), None), 4096) == 4096  # type: ignore[arg-type]
