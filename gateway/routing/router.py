"""The request path's one entry to routing: which model version serves a request, the scheduler that
queues it for that version's replicas, and the tokenizer of that version.

Two ways to know the replicas, chosen by ``SLUICE_ROUTING`` and logged at start:
- ``registry``: the routing table follows the registry (``gateway.routing.follower``); each version's
  tokenizer is read from its artifact (a local folder: ``file://`` or a path; a version whose artifact
  this gateway cannot read is not routed, and says why in /readyz).
- ``static``: one model, one version, one replica given at start (``SLUICE_TRITON_GRPC_URL`` or the
  in-process engine), the settings' tokenizer: a single replica without a control plane.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from gateway.errors import OpenAIError, model_not_found
from gateway.metrics import GatewayMetrics
from gateway.routing.pools import ReplicaPools
from gateway.routing.table import ModelRoutes, RoutingTable, VersionTarget
from gateway.scheduling.scheduler import ModelScheduler
from sluice.domain import Tenant
from sluice.engine_client import EngineClient
from sluice.text import TextCodec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """Where one request goes: its model version, the scheduler of that version, its tokenizer."""

    model: str
    version: str
    scheduler: ModelScheduler
    codec: TextCodec
    sticky: bool  # False: its conversation's version had no replica and another version served it


def model_unavailable(model: str) -> OpenAIError:
    return OpenAIError(
        503,
        f"Model '{model}' has no replica ready to serve it right now. Retry shortly.",
        type="server_error",
        code="model_unavailable",
    )


def local_artifact_dir(artifact_uri: str) -> Path | None:
    """The folder a ``file://`` URI or a plain absolute path names; None for a remote artifact."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "" and artifact_uri.startswith("/"):
        return Path(artifact_uri)
    return None


class Router:
    def __init__(self, pools: ReplicaPools, metrics: GatewayMetrics) -> None:
        self.pools = pools
        self._metrics = metrics
        self.table = RoutingTable(-1)
        self._codecs: dict[tuple[str, str], TextCodec] = {}  # (artifact_uri, digest) -> its tokenizer
        self._unreadable: dict[tuple[str, str], str] = {}  # (model, version) -> why it is not routed
        self._static_codec: TextCodec | None = None

    async def add_static(self, model: str, version: str, engine: EngineClient, codec: TextCodec) -> None:
        """Static routing: every request for ``model`` goes to ``engine`` (``version``)."""
        self._static_codec = codec
        await self.pools.add_static(model, version, engine)
        routes = ModelRoutes(model, {version: 100.0}, {version: VersionTarget(model, version, "", "", ())})
        self.table = RoutingTable(-1, {model: routes})

    async def apply(self, table: RoutingTable) -> None:
        """Route by ``table`` from now on (the registry follower calls this on every change)."""
        await self._load_codecs(table)
        self.table = table
        await self.pools.apply(table)

    def route(self, model: str, tenant: Tenant, conversation_key: str) -> Target:
        """The target of a request, or 404 ``model_not_found`` (unknown to routing, or not the tenant's)
        or 503 ``model_unavailable`` (no version of it has a replica in rotation)."""
        if model not in self.table.models or (tenant.allowed_models and model not in tenant.allowed_models):
            raise model_not_found(model)
        if self._static_codec is not None:  # one replica given at start: its version, always
            version = next(iter(self.table.models[model].split_pct))
            scheduler = self.pools.scheduler(model, version)
            assert scheduler is not None
            return Target(model, version, scheduler, self._static_codec, True)
        choice = self.table.choose(model, tenant.tenant_id, conversation_key)
        if choice is None:
            raise model_unavailable(model)
        scheduler = self.pools.scheduler(model, choice.version)
        codec = self._codec(model, choice.version)
        if scheduler is None or not scheduler.replica_ids or codec is None:
            raise model_unavailable(model)
        if not choice.sticky:
            self._metrics.version_fallbacks.labels(model, choice.version).inc()
        return Target(model, choice.version, scheduler, codec, choice.sticky)

    def models_for(self, tenant: Tenant) -> list[str]:
        """The routed models ``tenant`` may use, by name."""
        return sorted(m for m in self.table.models if not tenant.allowed_models or m in tenant.allowed_models)

    def report(self) -> dict[str, object]:
        return {
            **self.pools.report(),
            "models": {
                m: {"split_pct": dict(r.split_pct)} for m, r in sorted(self.table.models.items())
            },
            **({"unroutable_versions": {f"{m} {v}": why for (m, v), why in self._unreadable.items()}}
               if self._unreadable else {}),
        }  # fmt: skip

    def _codec(self, model: str, version: str) -> TextCodec | None:
        target = self.table.models[model].versions[version]
        return self._codecs.get((target.artifact_uri, target.weights_digest))

    async def _load_codecs(self, table: RoutingTable) -> None:
        """Read the tokenizer of every routed version this gateway has not read yet."""
        self._unreadable.clear()
        for routes in table.models.values():
            for version in routes.versions.values():
                key = (version.artifact_uri, version.weights_digest)
                if key in self._codecs:
                    continue
                folder = local_artifact_dir(version.artifact_uri)
                if folder is None:
                    why = f"artifact {version.artifact_uri} is not a local folder this gateway can read"
                else:
                    try:
                        self._codecs[key] = await asyncio.to_thread(TextCodec.from_checkpoint, folder)
                        continue
                    except (OSError, ValueError) as exc:
                        why = f"tokenizer at {folder} unreadable: {exc}"
                self._unreadable[(version.model, version.version)] = why
                log.error("%s version %s is not routed: %s", version.model, version.version, why)
