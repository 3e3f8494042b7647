"""The control plane service's application core: the one place that wires settings, the admin token store,
the model registry, metrics, controllers, the auth guard's role check and the error handlers.

``create_app(settings)`` opens what settings name (PostgreSQL when ``SLUICE_DATABASE_URL`` is set, else
the SQLite file under ``SLUICE_STATE_DIR``: the same database the gateway's tenant store uses, tables of
its own). A PostgreSQL down at start does not stop it: the stores open in the background and the admin
API answers 503 until they do. Tests may pass their own ``token_store`` / ``registry``; the app opens and
closes them the same way. The replica health checks run every ``health_interval_s`` as a background task;
the local replicas it started stop with it. With ``SLUICE_AUTOSCALER=on`` the autoscaler
(``control_plane.autoscaler``) runs as another background task, stopped before the replicas.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from litestar import Litestar
from litestar.logging.config import LoggingConfig
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components, SecurityScheme

from control_plane.autoscaler.service import open_autoscaler
from control_plane.service.auth import SECURITY_SCHEME, check_roles_declared
from control_plane.service.errors import exception_handlers
from control_plane.service.metrics import ControlPlaneMetrics, observe_requests
from control_plane.service.models import RegistryController
from control_plane.service.release_common import keep_encoded_slashes
from control_plane.service.releases import RELEASE_HANDLERS
from control_plane.service.replicas import ReplicasController, open_replica_services
from control_plane.service.rollout_guard import open_rollout_services
from control_plane.service.rollouts import RolloutController
from control_plane.service.state import ControlPlaneState
from control_plane.service.system import SYSTEM_HANDLERS
from control_plane.service.tokens import AdminController
from control_plane.service.usage import UsageReportController
from sluice.logs import LOG_FORMAT, quiet_noisy_libraries
from sluice.settings import Settings, redact_secrets
from sluice.stores.admin_tokens.base import AdminTokenStore
from sluice.stores.admin_tokens.dev import DEV_ADMIN_TOKEN_NAME, ensure_dev_admin_token
from sluice.stores.openers import open_admin_token_store, open_registry
from sluice.stores.registry.base import Registry

log = logging.getLogger("sluice.control_plane")

MAX_BODY_BYTES = 64 * 1024  # admin bodies are small: a token name, later a route or a version


def create_app(
    settings: Settings,
    *,
    token_store: AdminTokenStore | None = None,
    registry: Registry | None = None,
    health_interval_s: float | None = None,  # None: settings.replica_health_interval_s
) -> Litestar:
    metrics = ControlPlaneMetrics(settings.replica_hour_price_usd)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            tokens = await _open_token_store(settings, token_store)
            stack.push_async_callback(tokens.close)
            opened_registry = await _open_registry(settings, registry)
            stack.push_async_callback(opened_registry.close)
            replicas = await open_replica_services(
                settings, opened_registry, metrics, stack, health_interval_s=health_interval_s
            )
            rollouts = await open_rollout_services(settings, opened_registry, stack)
            autoscaler = await open_autoscaler(
                settings, opened_registry, replicas.local, replicas.states, metrics.registry, stack
            )
            app.state.cp = ControlPlaneState(
                settings=settings,
                tokens=tokens,
                registry=opened_registry,
                metrics=metrics,
                replicas=replicas,
                rollouts=rollouts,
                autoscaler=autoscaler,
            )
            _log_start(settings)
            yield
            log.info("control plane stopping: closing the admin token store and the registry")
        log.info("control plane stopped")

    app = Litestar(
        route_handlers=[
            AdminController,
            RegistryController,
            *RELEASE_HANDLERS,
            RolloutController,
            ReplicasController,
            UsageReportController,
            *SYSTEM_HANDLERS,
        ],
        exception_handlers=exception_handlers(metrics),
        middleware=[observe_requests(metrics)],
        lifespan=[lifespan],
        request_max_body_size=MAX_BODY_BYTES,
        openapi_config=OpenAPIConfig(
            title="Sluice control plane",
            version="0.1.0",
            path="/schema",
            description="The admin API: admin tokens with roles viewer < release-manager < platform-admin; "
            "the model registry.",
            components=Components(
                security_schemes={
                    SECURITY_SCHEME: SecurityScheme(
                        type="http",
                        scheme="bearer",
                        description="An admin token (sladm-...): `sluice admin-tokens create NAME --role "
                        "ROLE`. Tenant API keys are refused.",
                    )
                }
            ),
        ),
        # The root logger is the process's (control_plane.service.serving): Litestar keeps to its own.
        logging_config=LoggingConfig(
            configure_root_logger=False, formatters={"standard": {"format": LOG_FORMAT}}
        ),
    )
    check_roles_declared(app)
    keep_encoded_slashes(app)
    quiet_noisy_libraries()  # whoever set the log up: the pool's retries are counted, not logged
    return app


async def _open_token_store(settings: Settings, store: AdminTokenStore | None) -> AdminTokenStore:
    if store is None:  # a PostgreSQL down at start: start anyway, the admin API answers 503 until it answers
        return await open_admin_token_store(settings, keep_trying=True)
    await store.open()
    if settings.dev_tenants:
        await ensure_dev_admin_token(store)
    return store


async def _open_registry(settings: Settings, registry: Registry | None) -> Registry:
    if registry is None:
        return await open_registry(settings, keep_trying=True)
    await registry.open()
    return registry


def _log_start(settings: Settings) -> None:
    """One line an operator can read the configuration from, and a warning while the dev token works."""
    storage = (
        f"PostgreSQL {redact_secrets(settings.database_url)}"
        if settings.database_url is not None
        else f"SQLite {settings.sqlite_path}"
    )
    log.info(
        "control plane up on http://%s:%d: admin tokens and registry in %s; dev admin token %s",
        settings.control_plane_host,
        settings.control_plane_port,
        storage,
        "ON" if settings.dev_tenants else "off",
    )
    if settings.dev_tenants:
        log.warning(
            "the dev admin token %r (platform-admin) is active (SLUICE_DEV_TENANTS=true): anyone can read it "
            "in the source; it must not be used in production",
            DEV_ADMIN_TOKEN_NAME,
        )
