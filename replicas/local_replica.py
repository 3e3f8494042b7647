"""One local replica's process, with nothing of the registry: its folder under
``<state_dir>/replicas/<replica_id>/`` (the model repository, rendered once its weights are local), its
tritonserver on free loopback ports, and what the actuator (``replicas.local_replicas``) asks
of it: its gRPC endpoint and metrics URL, how many requests it holds (its Triton metrics), why a launch
failed in one line, and its cold start's phases so far (``ColdStart``).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import socket
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice.triton.metrics import replica_stats_from_metrics

if TYPE_CHECKING:
    from replicas.replica_weights import ColdStart

# NOTE: a gateway sees a registry change within about a second; a request it dispatched just before it
# saw the drain is on the replica by then. So a stop reads the replica's load only after this.
GATEWAY_PROPAGATION_S = 1.0
IDLE_POLL_S = 0.2
_TRITON_VERSION = re.compile(r"^[1-9][0-9]{0,8}$")


class InvalidReplicaRequest(ValueError):
    """What was asked cannot be started; the message says why (an HTTP 400)."""


def triton_version(version: str) -> int:
    """A registry version name as Triton's version folder, or ``InvalidReplicaRequest``."""
    if not _TRITON_VERSION.fullmatch(version):
        raise InvalidReplicaRequest(
            f"local replicas serve Triton model versions, positive integers without leading zeros; "
            f"version {version!r} is not one (register the weights as a version like '2')"
        )
    return int(version)


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the kernel says are free now (held open together, so they are distinct)."""
    with ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


@dataclass
class LocalReplica:
    """A replica's folder and server; ``launch`` is the actuator's task bringing it up."""

    replica_id: str
    version: str
    model: str
    digest: str  # the registry's weights digest of the version: its repository's config carries it
    folder: Path
    server: TritonServer
    cold_start: ColdStart
    launch: asyncio.Task[None] | None = None

    @classmethod
    def prepare(
        cls,
        root: Path,
        model: str,
        version: str,
        digest: str,
        cold_start: ColdStart,
        triton_state_dir: Path,
        ready_timeout_s: float,
    ) -> LocalReplica:
        """Make its folder ``root/<new replica_id>/`` and pick its ports (blocking file I/O); its repository
        is rendered by ``render`` once its weights are local."""
        slug = re.sub(r"[^A-Za-z0-9._-]", "-", model)[:64]
        replica_id = f"{slug}-{version}-{secrets.token_hex(3)}"
        folder = root / replica_id
        folder.mkdir(parents=True)
        http_port, grpc_port, metrics_port = free_ports(3)
        server = TritonServer(
            TritonServerConfig(
                model_repository=folder / "model_repository",
                http_port=http_port,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                state_dir=triton_state_dir,
                shm_prefix=f"sluice_r_{re.sub(r'[^A-Za-z0-9]', '_', replica_id)}_",
                ready_timeout_s=ready_timeout_s,
            )
        )
        return cls(replica_id, version, model, digest, folder, server, cold_start)

    def render(self, settings: CpuEngineModelSettings) -> None:
        """Write its model repository from ``settings`` (the local weights, the registry's digest)."""
        render_model_repository(self.folder / "model_repository", settings)

    @property
    def endpoint(self) -> str:
        return self.server.grpc_url

    @property
    def metrics_url(self) -> str:
        """Its Triton metrics, where gateways read its load."""
        return self.server.metrics_url

    async def num_in_flight(self, client: httpx.AsyncClient) -> int | None:
        """Requests running or waiting on it, from its metrics; None when they cannot be read."""
        try:
            response = await client.get(self.server.metrics_url)
        except httpx.HTTPError:
            return None
        stats = replica_stats_from_metrics(response.text, self.model)
        return None if stats is None else stats.num_running + stats.num_waiting

    async def wait_idle(self, timeout_s: float) -> int | None:
        """The requests it holds once it holds none, or when ``timeout_s`` is up (None: unknown)."""
        deadline = time.monotonic() + timeout_s
        await asyncio.sleep(min(GATEWAY_PROPAGATION_S, timeout_s))
        async with httpx.AsyncClient(timeout=1.0) as client:
            while True:
                num_held = await self.num_in_flight(client)
                if num_held == 0 or time.monotonic() >= deadline:
                    return num_held
                await asyncio.sleep(IDLE_POLL_S)


def launch_failure(exc: Exception) -> str:
    """One line for the registry: what happened, and the last line tritonserver logged."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return f"tritonserver failed to start: {type(exc).__name__}"
    last = f" (last log line: {lines[-1]})" if len(lines) > 1 else ""
    return f"{lines[0]}{last}"[:1000]
