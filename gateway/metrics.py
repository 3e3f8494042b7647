"""The gateway's Prometheus metrics, in a registry of its own (one per app, so tests can run several).

Declared in one table (``_SPECS``: the attribute, its kind, its name, its labels, its help and a
histogram's buckets); the class names each attribute's type for the code that uses it, and a test holds
the two to each other.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sluice.logs import QuietedLines

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)
# Cancel-to-free is the gateway closing a stream and releasing a slot: sub-millisecond to tens of ms.
_CANCEL_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
_MVC = ("model", "version", "request_class")
_MVPC = ("model", "version", "pool", "request_class")
_MVR = ("model", "version", "replica")


@dataclass(frozen=True)
class _Spec:
    attr: str  # the GatewayMetrics attribute
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str  # a Counter's without "_total" (prometheus_client adds it)
    labels: tuple[str, ...]
    help: str
    buckets: tuple[float, ...] = ()  # a Histogram's

    def make(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.kind is Histogram:
            return Histogram(self.name, self.help, self.labels, buckets=self.buckets, registry=registry)
        return self.kind(self.name, self.help, self.labels, registry=registry)


# fmt: off
_SPECS: tuple[_Spec, ...] = (
    _Spec("requests", Counter, "sluice_gateway_requests", ("route", "status_code", "outcome"),
          "Requests by route, HTTP status code and outcome (rejected before the engine, or how it "
          "ended)"),
    _Spec("outcomes", Counter, "sluice_gateway_request_outcomes", (*_MVC, "outcome"),
          "Requests that reached generation (queued at a version), by model, version, class and how "
          "they ended (finished, cancelled, deadline, failed, filtered, refused, replayed, interrupted:"
          " a batch line cut to run again): error rates per version for rollouts"),
    _Spec("ttft_s", Histogram, "sluice_gateway_time_to_first_token_seconds", _MVC,
          "From the request's arrival to its first output token, by model, version and class",
          _LATENCY_BUCKETS_S),
    _Spec("inter_token_s", Histogram, "sluice_gateway_inter_token_seconds", _MVC,
          "Time between output tokens, by model, version and class", _LATENCY_BUCKETS_S),
    _Spec("prompt_tokens", Counter, "sluice_gateway_prompt_tokens", _MVC,
          "Prompt tokens sent to a replica, by model, version and class"),
    _Spec("output_tokens", Counter, "sluice_gateway_output_tokens", _MVC,
          "Output tokens received from a replica (a cancelled stream's unread ones included), by model,"
          " version and class"),
    _Spec("in_flight", Gauge, "sluice_gateway_requests_in_flight", (),
          "Requests being generated now"),
    _Spec("refused", Counter, "sluice_gateway_refused", ("model", "reason"),
          "Requests refused before a replica saw them, by model and reason (quota limits, full queue, "
          "deadline)"),
    _Spec("queue_depth", Gauge, "sluice_gateway_queue_depth", _MVPC,
          "Requests waiting for dispatch, by model, version, pool and class"),
    _Spec("queue_age_s", Gauge, "sluice_gateway_queue_age_seconds", _MVPC,
          "How long the oldest request still waiting for dispatch has waited (0: none waits), by model,"
          " version, pool and class"),
    _Spec("admitted", Counter, "sluice_gateway_admitted", _MVPC,
          "Requests dispatched from the queue to a replica (first dispatch only: re-dispatches count in"
          " sluice_gateway_redispatches), by model, version, pool and class"),
    _Spec("cancellations", Counter, "sluice_gateway_cancellations", _MVC,
          "Requests whose client went away before they ended (queued or generating), by model, version "
          "and class"),
    _Spec("cancel_to_free_s", Histogram, "sluice_gateway_cancel_to_free_seconds", _MVC,
          "From the gateway learning the client left to the replica slot being released after the "
          "engine call was closed, by model, version and class", _CANCEL_BUCKETS_S),
    _Spec("queue_wait_s", Histogram, "sluice_gateway_queue_wait_seconds", _MVPC,
          "From arrival to dispatch to a replica, by model, version, pool and class", _LATENCY_BUCKETS_S),
    _Spec("replica_kv_free_tokens", Gauge, "sluice_gateway_replica_kv_free_tokens", _MVR,
          "Free KV tokens the replica reported at the last read"),
    _Spec("replica_kv_used_ratio", Gauge, "sluice_gateway_replica_kv_used_ratio", _MVR,
          "The replica's KV cache occupancy at the last read: used / total KV tokens (0..1)"),
    _Spec("replica_running_cap", Gauge, "sluice_gateway_replica_running_cap", _MVR,
          "How many requests this gateway lets the replica run at once, the batch bounded by the "
          "inter-token target (sluice.policy.batch_bound); 0: not bounded yet"),
    _Spec("replica_itl_p95_seconds", Gauge, "sluice_gateway_replica_itl_p95_seconds", _MVR,
          "The p95 of the recent gaps between a stream's deltas from the replica, as this gateway reads"
          " them (what its running cap is judged on)"),
    _Spec("redispatches", Counter, "sluice_gateway_redispatches", ("model", "version"),
          "Requests dispatched again after their replica failed before a first token, by model and "
          "version"),
    _Spec("replica_suspensions", Counter, "sluice_gateway_replica_suspensions", ("model", "version"),
          "Replicas this gateway stopped dispatching to after a request could not reach them"),
    _Spec("registry_generation", Gauge, "sluice_gateway_registry_generation", (),
          "The registry generation this gateway routes by (-1: none read yet; static routing: not set)"),
    _Spec("registry_read_failures", Counter, "sluice_gateway_registry_read_failures", (),
          "Registry reads that failed (the gateway kept routing by its last snapshot)"),
    _Spec("version_fallbacks", Counter, "sluice_gateway_version_fallbacks", ("model", "version"),
          "Requests whose conversation's version had no replica in rotation, served by another version"),
    _Spec("pool_fallbacks", Counter, "sluice_gateway_pool_fallbacks",
          ("model", "version", "wanted_pool", "pool"),
          "Requests queued for their version's other pool: the pool their prompt length asks for "
          "(long-prompt or general) had no replica in rotation"),
    _Spec("quota_fail_open", Counter, "sluice_gateway_quota_fail_open", (),
          "Quota decisions served from the local fallback because the quota store was unreachable"),
    _Spec("tenant_store_down", Gauge, "sluice_gateway_tenant_store_down", (),
          "1 while the tenant store is unavailable (known keys served from the cache, others refused)"),
    _Spec("tenant_stale_resolutions", Counter, "sluice_gateway_tenant_stale_resolutions", (),
          "API keys resolved from a cache entry past its TTL because the tenant store was unavailable"),
    _Spec("tenant_store_lookups", Counter, "sluice_gateway_tenant_store_lookups", (),
          "API key lookups sent to the tenant store (cache misses, after merging concurrent ones)"),
    _Spec("usage_outbox_pending", Gauge, "sluice_gateway_usage_outbox_pending", (),
          "Usage records in the durable outbox that the ledger has not accepted yet"),
    _Spec("usage_records_written", Counter, "sluice_gateway_usage_records_written", (),
          "Usage records the ledger accepted (directly, or replayed from the outbox)"),
    _Spec("usage_ledger_failures", Counter, "sluice_gateway_usage_ledger_failures", (),
          "Ledger writes of usage records that failed or timed out (the record stays in the outbox)"),
    _Spec("telemetry_dropped", Counter, "sluice_gateway_telemetry_dropped", ("sink",),
          "Telemetry records a sink did not deliver: its queue was full, or its destination (file, "
          "stdout, Redis) refused them, by sink"),
    _Spec("wasted_output_tokens", Counter, "sluice_gateway_superseded_output_tokens", (),
          "Output tokens generated by attempts that a retry with the same Idempotency-Key replaced "
          "(waste)"),
    _Spec("filtered", Counter, "sluice_gateway_content_filtered", ("stage", "category"),
          "Requests stopped by a safety classifier, by where (input, output) and category"),
    _Spec("degraded", Counter, "sluice_gateway_degraded", ("model", "action"),
          "Requests admitted with a fallback of their overloaded model, by that model and fallback "
          "(alias_to, max_tokens_cap, to_batch)"),
    _Spec("degraded_mode", Gauge, "sluice_gateway_degraded_mode", ("model",),
          "1 while the model is overloaded and its configured fallbacks apply (SLUICE_DEGRADATION)"),
    # The batch runner (gateway/batches): lines counted once committed, as the batch's own counts are.
    _Spec("batch_lines", Counter, "sluice_gateway_batch_lines", ("outcome",),
          "Batch lines committed by this gateway's runner, by outcome (completed; failed: answered with"
          " an error; invalid: malformed; cancelled or expired before they finished)"),
    _Spec("batch_line_retries", Counter, "sluice_gateway_batch_line_retries", ("reason",),
          "Batch lines refused for now (429 or 503) that waited Retry-After to run again, by the "
          "refusal"),
    _Spec("batches_active", Gauge, "sluice_gateway_batches_active", (),
          "Batches this gateway's runner holds now"),
    _Spec("files_expired", Counter, "sluice_gateway_files_expired", (),
          "Expired files this gateway's sweep deleted (one two gateways' sweeps raced on counts on "
          "both)"),
)
# fmt: on


class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    outcomes: Counter
    ttft_s: Histogram
    inter_token_s: Histogram
    prompt_tokens: Counter
    output_tokens: Counter
    in_flight: Gauge
    refused: Counter
    queue_depth: Gauge
    queue_age_s: Gauge
    admitted: Counter
    cancellations: Counter
    cancel_to_free_s: Histogram
    queue_wait_s: Histogram
    replica_kv_free_tokens: Gauge
    replica_kv_used_ratio: Gauge
    replica_running_cap: Gauge
    replica_itl_p95_seconds: Gauge
    redispatches: Counter
    replica_suspensions: Counter
    registry_generation: Gauge
    registry_read_failures: Counter
    version_fallbacks: Counter
    pool_fallbacks: Counter
    quota_fail_open: Counter
    tenant_store_down: Gauge
    tenant_stale_resolutions: Counter
    tenant_store_lookups: Counter
    usage_outbox_pending: Gauge
    usage_records_written: Counter
    usage_ledger_failures: Counter
    telemetry_dropped: Counter
    wasted_output_tokens: Counter
    filtered: Counter
    degraded: Counter
    degraded_mode: Gauge
    batch_lines: Counter
    batch_line_retries: Counter
    batches_active: Gauge
    files_expired: Counter

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for spec in _SPECS:
            setattr(self, spec.attr, spec.make(self.registry))
        self.registry.register(QuietedLines())  # the pool's retries and uvicorn's refusals, not logged

    def count_refused(self, model: str, reason: str) -> None:
        self.refused.labels(model, reason).inc()

    def count_rejected(self, route: str, status_code: int) -> None:
        self.requests.labels(route, str(status_code), "rejected").inc()

    def count_cancelled(
        self, model: str, version: str, request_class: str, cancel_to_free_s: float | None
    ) -> None:
        """A request whose client left; ``cancel_to_free_s`` None when it held no replica slot."""
        self.cancellations.labels(model, version, request_class).inc()
        if cancel_to_free_s is not None:
            self.cancel_to_free_s.labels(model, version, request_class).observe(cancel_to_free_s)

    def observe_replica_kv(
        self, model: str, version: str, replica: str, free_tokens: int, total_tokens: int
    ) -> None:
        self.replica_kv_free_tokens.labels(model, version, replica).set(free_tokens)
        used_ratio = 1.0 - free_tokens / total_tokens if total_tokens > 0 else 0.0
        self.replica_kv_used_ratio.labels(model, version, replica).set(used_ratio)

    def observe_replica_batch(
        self, model: str, version: str, replica: str, running_cap: int | None, itl_p95_ms: float | None
    ) -> None:
        self.replica_running_cap.labels(model, version, replica).set(running_cap or 0)
        if itl_p95_ms is not None:
            self.replica_itl_p95_seconds.labels(model, version, replica).set(itl_p95_ms / 1000)

    def forget_replica(self, model: str, version: str, replica: str) -> None:
        """A replica left this gateway's rotation: its gauges stop, rather than freeze at their last value."""
        gauges = (
            self.replica_kv_free_tokens, self.replica_kv_used_ratio, self.replica_running_cap,
            self.replica_itl_p95_seconds,
        )  # fmt: skip
        for gauge in gauges:
            with suppress(KeyError):
                gauge.remove(model, version, replica)

    def render(self) -> bytes:
        return generate_latest(self.registry)
