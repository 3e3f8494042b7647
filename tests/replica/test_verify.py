"""Replica verification against a real tritonserver: ready at the version, and serving the digest."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ports import free_ports

from replicas.launcher import TritonServer
from replicas.verify import verify_replica
from sluice.triton.client import grpc_target
from sluice.weights_digest import weights_digest

T = TypeVar("T")
Aio = Callable[[Coroutine[Any, Any, T]], T]


def test_a_replica_serving_the_registrys_digest_passes(
    aio: Aio, replica: TritonServer, dev_checkpoint: Path
) -> None:
    result = aio(verify_replica(replica.grpc_url, "sluice-tiny", "1", weights_digest(dev_checkpoint)))
    assert result.ok and result.detail == ""


def test_other_weights_another_version_a_missing_model_or_no_server_fail_with_the_reason(
    aio: Aio, replica: TritonServer, dev_checkpoint: Path
) -> None:
    digest = weights_digest(dev_checkpoint)
    wrong = aio(verify_replica(replica.grpc_url, "sluice-tiny", "1", "sha256:" + "0" * 64))
    assert not wrong.ok and "serves weights " + digest in wrong.detail
    other_version = aio(verify_replica(replica.grpc_url, "sluice-tiny", "2", digest))
    assert not other_version.ok and "version 2" in other_version.detail
    absent = aio(verify_replica(replica.grpc_url, "no-such-model", "1", digest))
    assert not absent.ok and "no-such-model" in absent.detail
    (port,) = free_ports(1)
    down = aio(verify_replica(f"127.0.0.1:{port}", "sluice-tiny", "1", digest, timeout_s=1.0))
    assert not down.ok and f"127.0.0.1:{port}" in down.detail


def test_an_endpoint_may_carry_a_scheme() -> None:
    assert grpc_target("grpc://10.0.0.7:8001") == grpc_target("10.0.0.7:8001") == "10.0.0.7:8001"
