"""The request path's one entry to routing: which model version serves a request, the scheduler that
queues it for that version's replicas, and the tokenizer of that version. ``route`` picks the version
(before the prompt is tokenized: the tokenizer depends on it); ``for_prompt`` then picks the version's
pool by the prompt's length (``gateway.routing.table.choose_pool``) and counts a fallback to the other
pool in ``sluice_gateway_pool_fallbacks_total``, logging when a version starts and stops falling back.

Two ways to know the replicas, chosen by ``SLUICE_ROUTING`` and logged at start:
- ``registry``: the routing table follows the registry (``gateway.routing.follower``); each version's
  tokenizer is read from its artifact through ``sluice.artifacts`` in a worker thread: a local folder
  (``file://`` or a path) as it is, an ``s3://`` one by fetching only its tokenizer files from the weight
  store into this node's cache (``read_tokenizer``). A version whose tokenizer this gateway cannot read
  (yet) is not routed, and says why in /readyz; the next registry read retries it. A table change waits
  at most ``TOKENIZER_WAIT_S`` for the tokenizers it is the first to ask for; a slower fetch goes on in
  the background and its version is routed once it lands.
- ``static``: one model, one version, one replica given at start (``SLUICE_TRITON_GRPC_URL`` or the
  in-process engine), the settings' tokenizer: a single replica without a control plane.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.errors import OpenAIError, model_not_found
from gateway.metrics import GatewayMetrics
from gateway.routing.pools import ReplicaPools
from gateway.routing.table import ModelRoutes, RoutingTable, VersionTarget, choose_pool
from gateway.scheduling.scheduler import ModelScheduler
from sluice.artifacts import StoreFactory, artifact_folder, is_tokenizer_file
from sluice.domain import Tenant
from sluice.engine_client import EngineClient
from sluice.engine_limits import EngineLimits
from sluice.stores.registry.base import ReplicaPool
from sluice.text import TextCodec
from sluice.tool_parsers import DEFAULT_PARSER
from sluice.weight_store import WeightStore

log = logging.getLogger(__name__)

# How long a routing table change waits for the tokenizers it is the first to ask for (then they go on
# being fetched in the background, and the table is applied without their versions meanwhile).
TOKENIZER_WAIT_S = 5.0
CodecKey = tuple[str, str]  # (artifact_uri, weights_digest)


@dataclass(frozen=True)
class Target:
    """Where one request goes: its model version, the scheduler of that version's pool, its tokenizer."""

    model: str
    version: str
    scheduler: ModelScheduler  # the pool's (``Router.for_prompt`` picks the pool once the prompt is known)
    codec: TextCodec
    sticky: bool  # False: its conversation's version had no replica and another version served it
    pool: ReplicaPool = ReplicaPool.GENERAL  # the pool ``scheduler`` queues for
    # Every pool of the version with a replica in rotation, and its scheduler.
    pools: Mapping[ReplicaPool, ModelScheduler] = field(default_factory=dict, repr=False, compare=False)
    # The version's engine build limits (gateway.openai.admission refuses a request over them); None:
    # bounded by the tokenizer's model context alone.
    limits: EngineLimits | None = None
    # The version's tool-call parser (gateway.openai.tools); None: unknown, it serves no tools.
    tool_call_parser: str | None = DEFAULT_PARSER


def model_unavailable(model: str) -> OpenAIError:
    return OpenAIError(
        503,
        f"Model '{model}' has no replica ready to serve it right now. Retry shortly.",
        type="server_error",
        code="model_unavailable",
    )


def read_tokenizer(artifact_uri: str, weights_digest: str, store: StoreFactory) -> TextCodec:
    """A version's tokenizer (blocking: call it in a worker thread): from a local folder as it is, from
    the weight store only the tokenizer's files. An artifact whose manifest records other weights than
    the version's is refused (ValueError). Raises ``ArtifactUnavailable``, OSError, ValueError."""
    artifact = artifact_folder(artifact_uri, store, include=is_tokenizer_file)
    if artifact.fetched is not None:
        recorded = artifact.fetched.manifest.metadata.get("weights_digest")
        if recorded is not None and recorded != weights_digest:
            raise ValueError(f"{artifact_uri} records weights {recorded}, not the version's {weights_digest}")
    return TextCodec.from_checkpoint(artifact.folder)


class Router:
    def __init__(self, pools: ReplicaPools, metrics: GatewayMetrics) -> None:
        self.pools = pools
        self._metrics = metrics
        self.table = RoutingTable(-1)
        self._codecs: dict[CodecKey, TextCodec] = {}
        self._reading: dict[CodecKey, asyncio.Task[TextCodec]] = {}  # tokenizers being read
        self._unreadable: dict[tuple[str, str], str] = {}  # (model, version) -> why it is not routed
        self._store: WeightStore | None = None  # made at the first s3:// artifact (in a worker thread)
        self._store_lock = threading.Lock()
        self._static_codec: TextCodec | None = None
        self._falling_back: set[tuple[str, str, ReplicaPool]] = set()  # (model, version, wanted pool)

    async def add_static(
        self,
        model: str,
        version: str,
        engine: EngineClient,
        codec: TextCodec,
        limits: EngineLimits | None = None,
        tool_call_parser: str | None = DEFAULT_PARSER,
    ) -> None:
        """Static routing: every request for ``model`` goes to ``engine`` (``version``), refused before
        dispatch when over the engine's build ``limits`` (``SLUICE_STATIC_BUILD_CONFIG``), as a registry
        version's are; its answers are read for tool calls by ``tool_call_parser``."""
        self._static_codec = codec
        await self.pools.add_static(model, version, engine)
        target = VersionTarget(model, version, "", "", (), limits=limits, tool_call_parser=tool_call_parser)
        routes = ModelRoutes(model, {version: 100.0}, {version: target})
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
            routed = self.table.models[model].versions[version]
            return Target(
                model, version, scheduler, self._static_codec, True, limits=routed.limits,
                tool_call_parser=routed.tool_call_parser,
            )  # fmt: skip
        choice = self.table.choose(model, tenant.tenant_id, conversation_key)
        if choice is None:
            raise model_unavailable(model)
        schedulers = self.pools.schedulers_of(model, choice.version)
        codec = self._codec(model, choice.version)
        if not schedulers or codec is None:
            raise model_unavailable(model)
        if not choice.sticky:
            self._metrics.version_fallbacks.labels(model, choice.version).inc()
        pool = ReplicaPool.GENERAL if ReplicaPool.GENERAL in schedulers else ReplicaPool.LONG_PROMPT
        routed = self.table.models[model].versions[choice.version]
        return Target(
            model, choice.version, schedulers[pool], codec, choice.sticky, pool, schedulers, routed.limits,
            routed.tool_call_parser,
        )  # fmt: skip

    def for_prompt(self, target: Target, num_prompt_tokens: int) -> Target:
        """``target`` queued for the pool a prompt of ``num_prompt_tokens`` goes to (module docstring);
        as it is with static routing (one replica, no pools)."""
        threshold = self.pools.settings.long_prompt_min_tokens
        choice = choose_pool(num_prompt_tokens, threshold, target.pools)
        if choice is None:
            return target
        model, version = target.model, target.version
        key = (model, version, choice.wanted)
        if choice.is_fallback:
            self._metrics.pool_fallbacks.labels(model, version, choice.wanted, choice.pool).inc()
            if key not in self._falling_back:
                self._falling_back.add(key)
                log.warning(
                    "%s version %s has no %s replica in rotation: its %s prompts go to the %s pool",
                    model, version, choice.wanted,
                    "long" if choice.wanted is ReplicaPool.LONG_PROMPT else "short", choice.pool,
                )  # fmt: skip
        elif key in self._falling_back:
            self._falling_back.discard(key)
            log.info("%s version %s: its %s pool is in rotation again", model, version, choice.wanted)
        if choice.pool == target.pool:
            return target
        return dataclasses.replace(target, scheduler=target.pools[choice.pool], pool=choice.pool)

    def models_for(self, tenant: Tenant) -> list[str]:
        """The routed models ``tenant`` may use, by name."""
        return sorted(m for m in self.table.models if not tenant.allowed_models or m in tenant.allowed_models)

    def report(self) -> dict[str, object]:
        return {
            **self.pools.report(),
            "models": {m: {"split_pct": dict(r.split_pct)} for m, r in sorted(self.table.models.items())},
            **({"unroutable_versions": unroutable} if (unroutable := self._unroutable()) else {}),
        }

    def _unroutable(self) -> dict[str, str]:
        """Why each version without a tokenizer is not routed (one fetched since the last read is)."""
        return {
            f"{m} {v}": why
            for (m, v), why in self._unreadable.items()
            if m not in self.table.models or v not in self.table.models[m].versions or not self._codec(m, v)
        }

    def _codec(self, model: str, version: str) -> TextCodec | None:
        target = self.table.models[model].versions[version]
        return self._codecs.get((target.artifact_uri, target.weights_digest))

    async def _load_codecs(self, table: RoutingTable) -> None:
        """Read the tokenizer of every routed version this gateway has not read yet (module docstring)."""
        wanted: dict[CodecKey, list[VersionTarget]] = {}
        for routes in table.models.values():
            for version in routes.versions.values():
                key = (version.artifact_uri, version.weights_digest)
                if key not in self._codecs:
                    wanted.setdefault(key, []).append(version)
        for gone in [k for k, task in self._reading.items() if k not in wanted and task.done()]:
            del self._reading[gone]  # its version left the table before its read was looked at
        started = [self._start_reading(key) for key in wanted if key not in self._reading]
        if started:
            await asyncio.wait(started, timeout=TOKENIZER_WAIT_S)
        unreadable: dict[tuple[str, str], str] = {}
        for key, targets in wanted.items():
            why = self._why_unread(key)
            for target in targets if why else ():
                unreadable[(target.model, target.version)] = why
                if self._unreadable.get((target.model, target.version)) != why:  # once per reason
                    log.error("%s version %s is not routed: %s", target.model, target.version, why)
        self._unreadable = unreadable

    def _start_reading(self, key: CodecKey) -> asyncio.Task[TextCodec]:
        async def read() -> TextCodec:
            codec = await asyncio.to_thread(read_tokenizer, key[0], key[1], self._weight_store)
            self._codecs[key] = codec  # routed from now on, without waiting for the next table
            return codec

        task = asyncio.create_task(read(), name=f"tokenizer {key[0]}")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # read by _why_unread, maybe not
        self._reading[key] = task
        return task

    def _why_unread(self, key: CodecKey) -> str:
        """Why ``key``'s tokenizer is not read yet ("" once it is); a failed read is retried next time."""
        if key in self._codecs:
            self._reading.pop(key, None)
            return ""
        task = self._reading[key]
        if not task.done():
            return f"its tokenizer is still being fetched from {key[0]}"
        del self._reading[key]
        exc = None if task.cancelled() else task.exception()
        return f"tokenizer of {key[0]} unreadable: {exc or 'its read was cancelled'}"

    def _weight_store(self) -> WeightStore:
        with self._store_lock:
            if self._store is None:
                self._store = WeightStore.from_settings(self.pools.settings, quiet=True)
            return self._store
