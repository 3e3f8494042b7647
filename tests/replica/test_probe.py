"""The inference probe against real tritonservers: it passes on a serving replica, fails with the reason
for another version, a missing model or no server, and catches a wedged engine (Triton up and ready, no
token) as ``wedged: no token within ...``; the same replica passes again once its engine is thawed."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ports import free_ports
from wedge import wedged_engine

from replicas.launcher import TritonServer
from replicas.probe import probe_replica
from replicas.verify import verify_replica
from sluice.weights_digest import weights_digest

T = TypeVar("T")
Aio = Callable[[Coroutine[Any, Any, T]], T]
MODEL = "sluice-tiny"


def test_a_serving_replica_passes_within_the_deadline(aio: Aio[Any], replica: TritonServer) -> None:
    for _ in range(2):  # and again: the probe's prefix is cached in its own scope, nothing breaks
        result = aio(probe_replica(replica.grpc_url, MODEL, "1", timeout_s=2.0))
        assert result.ok and result.detail == "" and 0 < result.elapsed_s < 2.0


def test_another_version_a_missing_model_or_no_server_fail_with_the_reason(
    aio: Aio[Any], replica: TritonServer
) -> None:
    other_version = aio(probe_replica(replica.grpc_url, MODEL, "2"))
    assert not other_version.ok and "version 2" in other_version.detail
    absent = aio(probe_replica(replica.grpc_url, "no-such-model", "1"))
    assert not absent.ok and "no-such-model" in absent.detail
    (port,) = free_ports(1)
    down = aio(probe_replica(f"127.0.0.1:{port}", MODEL, "1", timeout_s=1.0))
    assert not down.ok and f"127.0.0.1:{port}" in down.detail


def test_a_wedged_engine_fails_the_probe_while_triton_still_reports_it_ready(
    aio: Aio[Any], start_replica: Callable[[str], TritonServer], dev_checkpoint: Path
) -> None:
    server = start_replica("probe_wedge")  # its own: frozen threads must not touch the shared replica
    digest = weights_digest(dev_checkpoint)
    assert aio(probe_replica(server.grpc_url, MODEL, "1")).ok
    with wedged_engine(server.config.effective_shm_prefix):
        assert aio(verify_replica(server.grpc_url, MODEL, "1", digest)).ok  # readiness cannot tell
        wedged = aio(probe_replica(server.grpc_url, MODEL, "1", timeout_s=1.0))
        assert not wedged.ok and wedged.detail == "wedged: no token within 1.0 s"
        assert 1.0 <= wedged.elapsed_s < 1.5
    thawed = aio(probe_replica(server.grpc_url, MODEL, "1", timeout_s=5.0))
    assert thawed.ok, thawed.detail
    assert server.is_running()
