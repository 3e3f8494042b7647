"""What every request handler shares: settings, the router (which model version serves a request: its
scheduler, replicas and tokenizer), the ledger (read) and the usage meter (its only writer), the tenant
resolver, telemetry, metrics, the quota store, the safety policies, the idempotency store, tenants' files,
the batch store and this gateway's batch runner, and the models' overload detectors (degradation). Built
once in ``gateway.app``; handlers reach it as ``app.state.gw``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gateway.degradation import Degradation
from gateway.metering.pipeline import UsageMeter
from gateway.metrics import GatewayMetrics
from gateway.routing.follower import RegistryFollower
from gateway.routing.router import Router
from gateway.telemetry import TelemetryWriter
from gateway.upload_slots import UploadLimit
from sluice.domain import Tenant
from sluice.engine_client import EngineClient
from sluice.safety.policy import SafetyPolicy
from sluice.settings import Settings
from sluice.stores.batches.base import BatchStore
from sluice.stores.files.catalog import FileCatalog
from sluice.stores.idempotency.base import IdempotencyStore
from sluice.stores.ledger.base import UsageLedger
from sluice.stores.quota.base import QuotaStore
from sluice.text import TextCodec


class TenantResolver(Protocol):
    async def resolve(self, api_key: str) -> Tenant | None: ...


class BatchRunnerHandle(Protocol):
    """What the Batch API tells this gateway's batch runner (``gateway.batches.runner``)."""

    def wake(self) -> None: ...

    def cancel_requested(self, batch_id: str) -> None: ...


class NoBatchRunner:
    """A gateway that runs no batches (``SLUICE_BATCH_RUNNER=false``): it accepts and reports them, and
    the runners of other gateways claim them from the shared batch store."""

    def wake(self) -> None:
        return None

    def cancel_requested(self, batch_id: str) -> None:
        return None


@dataclass
class GatewayState:
    settings: Settings
    codec: TextCodec  # the settings' checkpoint's (static routing's); a registry's versions bring their own
    engine: EngineClient | None  # static routing's one replica; None when routing follows the registry
    router: Router
    follower: RegistryFollower | None  # registry routing's; None for static routing
    ledger: UsageLedger
    tenants: TenantResolver
    telemetry: TelemetryWriter
    metrics: GatewayMetrics
    quota: QuotaStore
    safety: dict[str, SafetyPolicy]  # by name; a tenant names one (Tenant.safety_policy)
    idempotency: IdempotencyStore
    meter: UsageMeter  # usage records go through it (durable outbox), never straight to the ledger
    batches: BatchStore  # batches and their committed parts (the Batch API, the batch runner)
    files: FileCatalog  # tenants' files (Files API, batch input and output) in the object store
    batch_runner: BatchRunnerHandle = field(default_factory=NoBatchRunner)  # set once the app is built
    # Each configured model's overload state and fallbacks (SLUICE_DEGRADATION), read at admission.
    degradation: Degradation = field(init=False)
    upload_limit: UploadLimit = field(init=False)  # uploads read at once (gateway.upload_slots)

    def __post_init__(self) -> None:
        self.degradation = Degradation(self.settings.degradation_fallbacks, self.router, self.metrics)
        self.upload_limit = UploadLimit(self.settings.file_max_concurrent_uploads)
