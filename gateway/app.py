"""The gateway's application core: the one place that wires settings, the tokenizer, the engine client,
the ledger and its usage meter (outbox under ``<state_dir>/outbox``), the tenant resolver, the quota
store, the model's scheduler, the safety policies, the idempotency store, the files' object store,
telemetry, metrics, controllers and error handlers.

``create_app(settings)`` opens what settings name (``sluice.stores.openers`` picks PostgreSQL or SQLite; the
engine client is the one ``settings.engine_client`` names, logged at start, never a fallback). Tests may
pass their own ``engine`` / ``ledger`` / ``tenant_store``; the app opens and closes them the same way.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from litestar import Litestar
from litestar.logging.config import LoggingConfig
from litestar.openapi import OpenAPIConfig

from gateway.auth import tenant_resolver
from gateway.batches.controller import BatchesController
from gateway.batches.runner import BatchRunner
from gateway.batches.work import Stores, WorkLimits
from gateway.engine_clients import open_engine_client
from gateway.errors import exception_handlers
from gateway.files.controller import files_controller
from gateway.files.sweeper import FileSweeper
from gateway.metering.outbox import Outbox
from gateway.metering.pipeline import UsageMeter
from gateway.metrics import GatewayMetrics
from gateway.openai.controller import OpenAIController
from gateway.openapi_links import add_links
from gateway.routing.follower import RegistryFollower
from gateway.routing.pools import ReplicaPools
from gateway.routing.router import Router
from gateway.routing.table import ReplicaTarget
from gateway.state import GatewayState
from gateway.system import SYSTEM_HANDLERS
from gateway.telemetry import TelemetryWriter, open_telemetry
from gateway.usage.controller import UsageController
from replicas.verify import Verification, verify_replica
from sluice.engine_client import EngineClient
from sluice.engine_client.dialects import Dialect
from sluice.engine_client.triton import TritonEngineClient
from sluice.engine_limits import limits_of
from sluice.logs import LOG_FORMAT, quiet_noisy_libraries
from sluice.safety.config import load_safety_config
from sluice.safety.policy import SafetyPolicy, build_policies
from sluice.safety.triton import TritonClassifier
from sluice.settings import Settings, redact_secrets
from sluice.stores.files.base import ObjectStore
from sluice.stores.files.catalog import FileCatalog
from sluice.stores.ledger.base import UsageLedger
from sluice.stores.openers import (
    open_batch_store,
    open_idempotency_store,
    open_ledger,
    open_object_store,
    open_quota_store,
    open_registry,
    open_tenant_store,
)
from sluice.stores.quota.base import QuotaStore
from sluice.stores.registry.base import Registry
from sluice.stores.tenants.base import TenantStore, seed_dev_tenants
from sluice.text import TextCodec
from sluice.tool_parsers import tool_call_parser_of

log = logging.getLogger("sluice.gateway")


def create_app(
    settings: Settings,
    *,
    engine: EngineClient | None = None,
    ledger: UsageLedger | None = None,
    tenant_store: TenantStore | None = None,
    codec: TextCodec | None = None,
    quota: QuotaStore | None = None,
    registry: Registry | None = None,
) -> Litestar:
    """``engine`` (static routing) or ``registry`` (registry routing), when given, replace what settings
    name; either is opened and closed with the app."""
    if settings.routing == "static" and engine is None:
        engine = open_engine_client(
            settings.engine_client,
            model_name=settings.model_name,
            triton_grpc_url=settings.triton_grpc_url,
            triton_metrics_url=settings.triton_metrics_url,
            checkpoint_dir=settings.checkpoint_dir,
            engine_dtype=settings.engine_dtype,
            build_config=settings.static_build,
        )
    codec = codec or TextCodec.from_checkpoint(settings.checkpoint_dir)
    metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            router, follower = await _open_routing(settings, metrics, stack, engine, codec, registry)
            opened_ledger, meter = await _open_metering(settings, metrics, stack, ledger)
            store = await _open_tenant_store(settings, tenant_store)
            stack.push_async_callback(store.close)
            opened_quota = quota or await open_quota_store(settings, on_fail_open=metrics.quota_fail_open.inc)
            if quota is not None:
                await quota.open()
            stack.push_async_callback(opened_quota.close)
            idempotency = await open_idempotency_store(settings)
            stack.push_async_callback(idempotency.close)
            object_store = await open_object_store(settings)
            stack.push_async_callback(object_store.close)
            batch_store = await open_batch_store(settings, keep_trying=True)  # PostgreSQL down: 503s till up
            stack.push_async_callback(batch_store.close)
            app.state.gw = GatewayState(
                settings=settings,
                codec=codec,
                engine=engine,
                router=router,
                follower=follower,
                ledger=opened_ledger,
                tenants=tenant_resolver(store, settings, metrics),
                telemetry=_open_telemetry(settings, metrics, stack),
                metrics=metrics,
                quota=opened_quota,
                meter=meter,
                safety=_open_safety(settings, stack),
                idempotency=idempotency,
                files=FileCatalog(object_store),
                batches=batch_store,
            )
            await _start_background_work(app.state.gw, object_store, store, stack)
            # Everything built so far lives as long as the process: keep it out of the collector's
            # generations so a collection pass on the request path does not walk it (tail latency).
            gc.collect()
            gc.freeze()
            _log_start(settings, engine)
            yield
            log.info("gateway stopping: closing the engine client, stores and telemetry")
        log.info("gateway stopped")

    app = Litestar(
        route_handlers=[
            OpenAIController,
            UsageController,
            BatchesController,
            files_controller(settings.file_max_bytes),  # its own body limit: a file, not a JSON body
            *SYSTEM_HANDLERS,
        ],
        exception_handlers=exception_handlers(metrics),
        lifespan=[lifespan],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Sluice", version="0.1.0", path="/schema"),
        # The root logger is the process's (gateway.serving): Litestar keeps to its own, in the same format.
        logging_config=LoggingConfig(
            configure_root_logger=False, formatters={"standard": {"format": LOG_FORMAT}}
        ),
    )
    add_links(app.openapi_schema)
    quiet_noisy_libraries()  # whoever set the log up: the pool's retries are counted, not logged
    return app


async def _open_routing(
    settings: Settings,
    metrics: GatewayMetrics,
    stack: AsyncExitStack,
    engine: EngineClient | None,
    codec: TextCodec,
    registry: Registry | None,
) -> tuple[Router, RegistryFollower | None]:
    """The router, static (one replica: ``engine``) or following the registry; closed by ``stack``."""
    pools = ReplicaPools(settings, metrics, _replica_client, _verify)
    router = Router(pools, metrics)
    stack.push_async_callback(pools.close)
    if settings.routing == "static":
        assert engine is not None
        await engine.start()
        stack.push_async_callback(engine.close)
        limits = limits_of(settings.static_build)  # None: bounded by the model's context alone
        parser = tool_call_parser_of(settings.static_build)  # None: unknown, logged; no tools served
        await router.add_static(settings.model_name, engine.model_version, engine, codec, limits, parser)
        return router, None
    if registry is None:  # a PostgreSQL down at start: start anyway, route once it answers
        registry = await open_registry(settings, keep_trying=True)
    else:
        await registry.open()
    stack.push_async_callback(registry.close)
    follower = RegistryFollower(registry, router, metrics, settings.registry_poll_interval_s)
    await follower.start()
    stack.push_async_callback(follower.close)
    return router, follower


async def _open_metering(
    settings: Settings, metrics: GatewayMetrics, stack: AsyncExitStack, ledger: UsageLedger | None
) -> tuple[UsageLedger, UsageMeter]:
    """The ledger and the usage meter in front of it (its outbox replays what a previous run left
    pending); the meter closes before the ledger, so writes in flight land."""
    opened_ledger = await _open_ledger(settings, ledger)
    stack.push_async_callback(opened_ledger.close)
    meter = UsageMeter(
        opened_ledger,
        Outbox(settings.state_dir / "outbox"),
        on_written=metrics.usage_records_written.inc,
        on_ledger_failure=metrics.usage_ledger_failures.inc,
    )
    await meter.open()
    stack.push_async_callback(meter.close)
    metrics.usage_outbox_pending.set_function(lambda: meter.num_pending)
    return opened_ledger, meter


def _open_safety(settings: Settings, stack: AsyncExitStack) -> dict[str, SafetyPolicy]:
    """The safety policies by name; the Triton classifier (policy "strict") is another model on the
    replica's Triton server."""
    classifier = TritonClassifier(settings.triton_grpc_url, model_name=settings.safety_classifier_model)
    stack.push_async_callback(classifier.close)
    return build_policies(load_safety_config(settings.safety_config_path), triton=classifier)


def _open_telemetry(settings: Settings, metrics: GatewayMetrics, stack: AsyncExitStack) -> TelemetryWriter:
    """The telemetry writer to the configured sinks; at close it writes what is queued."""
    dropped = metrics.telemetry_dropped
    for sink in settings.telemetry_sink_names:
        dropped.labels(sink)  # exported at 0 from the start
    telemetry = open_telemetry(settings, on_drop=lambda sink, n: dropped.labels(sink).inc(n))
    stack.push_async_callback(asyncio.to_thread, telemetry.close)
    return telemetry


async def _start_background_work(
    gw: GatewayState, object_store: ObjectStore, tenants: TenantStore, stack: AsyncExitStack
) -> None:
    """The expired-file sweeper and (unless turned off) the batch runner. The runner closes first (the
    stack unwinds in reverse): the lines it drains still meter."""
    settings = gw.settings
    sweeper = FileSweeper(gw.files, settings.file_sweep_interval_s, on_expired=gw.metrics.files_expired.inc)
    await sweeper.start()
    stack.push_async_callback(sweeper.close)
    if not settings.batch_runner:
        log.info("batch runner off (SLUICE_BATCH_RUNNER=false): other gateways run the batches")
        return
    runner = _batch_runner(gw, object_store, tenants, settings)
    await runner.start()
    stack.push_async_callback(runner.close)
    gw.batch_runner = runner


def _replica_client(target: ReplicaTarget) -> EngineClient:
    # A replica registered without a metrics URL: its load is not read, so the scheduler's KV gate stays
    # open for it and the replica's own admission applies.
    # NOTE: a target without a dialect never gets here (gateway.routing.pools.unservable refuses it).
    dialect = target.dialect or Dialect.CPU_ENGINE
    client = TritonEngineClient(
        target.endpoint, target.model, metrics_url=target.metrics_url or None, dialect=dialect
    )
    client.model_version = target.version
    return client


async def _verify(target: ReplicaTarget) -> Verification:
    return await verify_replica(target.endpoint, target.model, target.version, target.weights_digest)


def _batch_runner(
    gw: GatewayState, objects: ObjectStore, tenants: TenantStore, settings: Settings
) -> BatchRunner:
    limits = WorkLimits(
        lease_s=settings.batch_lease_s,
        max_lines=settings.batch_max_lines,
        line_concurrency=settings.batch_line_concurrency,
        part_max_lines=settings.batch_part_max_lines,
        flush_interval_s=settings.batch_flush_interval_s,
    )
    stores = Stores(batches=gw.batches, files=gw.files, objects=objects)
    return BatchRunner(
        gw,
        stores,
        tenants,
        limits,
        max_active=settings.batch_max_active,
        poll_interval_s=settings.batch_poll_interval_s,
        drain_s=settings.batch_drain_s,
    )


def _telemetry_sinks(settings: Settings) -> str:
    """Where telemetry goes, for the start-up line: e.g. "file .sluice/telemetry.jsonl, redis stream x"."""
    where = {
        "file": f"file {settings.telemetry_path}",
        "stdout": "stdout",
        "redis": f"redis stream {settings.telemetry_redis_stream}",
    }
    return ", ".join(where[name] for name in settings.telemetry_sink_names)


def _log_start(settings: Settings, engine: EngineClient | None) -> None:
    """One line an operator can read the configuration from, and a warning while dev keys work."""
    storage = (
        f"PostgreSQL {redact_secrets(settings.database_url)}"
        if settings.database_url is not None
        else f"SQLite {settings.sqlite_path}"
    )
    shared = (
        f"Redis {redact_secrets(settings.redis_url)}"
        if settings.redis_url is not None
        else "in process (this gateway only)"
    )
    routing = (
        f"static: model {settings.model_name} on {engine.kind} replica {engine.replica}"
        + (
            f" (build config {json.dumps(settings.static_build, sort_keys=True)})"
            if settings.static_build
            else ""
        )
        if engine is not None
        else "following the model registry"
    )
    log.info(
        "gateway up: routing %s; ledger and tenants: %s; quotas and idempotency: %s; telemetry %s; dev "
        "tenants %s",
        routing,
        storage,
        shared,
        _telemetry_sinks(settings),
        "ON" if settings.dev_tenants else "off",
    )
    if settings.dev_tenants:
        log.warning(
            "dev API keys sk-acme-dev and sk-globex-dev are active (SLUICE_DEV_TENANTS=true): anyone can "
            "read them in the source; they must not be used in production"
        )


async def _open_ledger(settings: Settings, ledger: UsageLedger | None) -> UsageLedger:
    if ledger is None:  # a PostgreSQL down at start: start anyway, usage waits in the outbox
        return await open_ledger(settings, keep_trying=True, report_outages=False)  # the meter reports
    await ledger.open()
    return ledger


async def _open_tenant_store(settings: Settings, store: TenantStore | None) -> TenantStore:
    if store is None:  # a PostgreSQL down at start: start anyway, requests get 503 until it answers
        return await open_tenant_store(settings, keep_trying=True, report_outages=False)  # the cache does
    await store.open()
    if settings.dev_tenants:
        await seed_dev_tenants(store)
    return store
