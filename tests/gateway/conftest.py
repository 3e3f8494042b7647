"""Gateways for the gateway tests: one over the in-process engine (fast), one over a real tritonserver
(the spine); both with real settings, SQLite ledger and tenant store, and the dev tenants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import RunningGateway, start_gateway

from replicas.launcher import TritonServer


@pytest.fixture(scope="session")
def inprocess_gateway(
    dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("gateway_inprocess"),
        dev_checkpoint,
        engine_client="inprocess",
        max_prompt_tokens=256,
        max_output_tokens=256,
        max_body_bytes=64 * 1024,
    )
    yield gateway
    gateway.stop()


@pytest.fixture(scope="session")
def triton_gateway(
    dev_checkpoint: Path, replica: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("gateway_triton"),
        dev_checkpoint,
        engine_client="triton",
        triton_grpc_url=replica.grpc_url,
        max_prompt_tokens=256,
        max_output_tokens=256,
    )
    yield gateway
    gateway.stop()
