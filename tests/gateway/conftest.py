"""Gateways for the gateway tests: one over the in-process engine (fast), one over a real tritonserver
(the spine); both with real settings, SQLite ledger and tenant store, and the dev tenants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from harness import RunningGateway, start_gateway
from pg import PostgresUnreachable, created_database
from tcp_proxy import ProxyThread

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


@pytest.fixture
def database() -> Iterator[str]:
    """A PostgreSQL database created for one test (its URL, straight to the server), dropped after it."""
    try:
        with created_database() as url:
            yield url
    except PostgresUnreachable as exc:
        pytest.skip(str(exc))


@pytest.fixture
def pg_proxy(database: str) -> Iterator[ProxyThread]:
    """A TCP proxy in front of ``database``'s server, to cut and restore while a gateway runs."""
    info = psycopg.conninfo.conninfo_to_dict(database)
    proxy = ProxyThread(str(info.get("host") or "127.0.0.1"), int(str(info.get("port") or 5432)))
    yield proxy
    proxy.close()
