"""Fixtures shared by every test folder: the dev checkpoint, and real tritonservers serving the CPU
engine on free ports (used by tests/replica and tests/gateway), and a PostgreSQL database of a test's own
with a TCP proxy in front of it to cut and restore."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from pg import PostgresUnreachable, created_database
from ports import free_ports
from tcp_proxy import ProxyThread

from cpu_engine.devckpt import write_checkpoint
from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository

T = TypeVar("T")


@pytest.fixture(scope="session")
def dev_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dev checkpoint (seed 0), written once per test session. Treat it as read-only."""
    return write_checkpoint(tmp_path_factory.mktemp("dev_checkpoint"), seed=0)


@pytest.fixture
def three_free_ports() -> list[int]:
    return free_ports(3)


@pytest.fixture(scope="session")
def model_settings(dev_checkpoint: Path) -> CpuEngineModelSettings:
    # Stats every 20 ms so a test sees the engine's state change well within its one-second bound.
    return CpuEngineModelSettings(checkpoint_dir=dev_checkpoint, num_kv_blocks=256, stats_interval_ms=20)


@pytest.fixture(scope="session")
def model_repository(
    model_settings: CpuEngineModelSettings, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    repo = tmp_path_factory.mktemp("model_repository")
    render_model_repository(repo, model_settings)
    return repo


@pytest.fixture(scope="session")
def start_replica(
    model_repository: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], TritonServer]]:
    """Start another server on free ports with its own shm prefix; all are stopped at session end."""
    state_dir = tmp_path_factory.mktemp("triton_state")
    started: list[TritonServer] = []

    def start(tag: str) -> TritonServer:
        http, grpc, metrics = free_ports(3)
        config = TritonServerConfig(
            model_repository=model_repository,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            state_dir=state_dir,
            shm_prefix=f"sluice_test_{os.getpid()}_{tag}_",
            exit_timeout_s=1,
            stop_timeout_s=10,
        )
        server = TritonServer(config)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def replica(start_replica: Callable[[str], TritonServer]) -> TritonServer:
    return start_replica("main")


@pytest.fixture(scope="session")
def aio() -> Iterator[Callable[[Coroutine[Any, Any, T]], T]]:
    """``aio(coro)`` runs a coroutine on one loop kept for the session (grpc.aio's poller outlives a loop)."""
    with asyncio.Runner() as runner:
        yield runner.run


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
