"""The gateway's Prometheus metrics, in a registry of its own (one per app, so tests can run several)."""

from __future__ import annotations

from contextlib import suppress

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)
# Cancel-to-free is the gateway closing a stream and releasing a slot: sub-millisecond to tens of ms.
_CANCEL_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sluice_gateway_requests",
            "Requests by route, HTTP status code and outcome (rejected before the engine, or how it ended)",
            ["route", "status_code", "outcome"],
            registry=self.registry,
        )
        self.outcomes = Counter(
            "sluice_gateway_request_outcomes",
            "Requests that reached generation (queued at a version), by model, version, class and how they "
            "ended (finished, cancelled, deadline, failed, filtered, refused, replayed, interrupted: a batch "
            "line cut to run again): error rates per version for rollouts",
            ["model", "version", "request_class", "outcome"],
            registry=self.registry,
        )
        self.ttft_s = Histogram(
            "sluice_gateway_time_to_first_token_seconds",
            "From the request's arrival to its first output token, by model, version and class",
            ["model", "version", "request_class"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.inter_token_s = Histogram(
            "sluice_gateway_inter_token_seconds",
            "Time between output tokens, by model, version and class",
            ["model", "version", "request_class"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "sluice_gateway_prompt_tokens",
            "Prompt tokens sent to a replica, by model, version and class",
            ["model", "version", "request_class"],
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "sluice_gateway_output_tokens",
            "Output tokens received from a replica (a cancelled stream's unread ones included), "
            "by model, version and class",
            ["model", "version", "request_class"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "sluice_gateway_requests_in_flight", "Requests being generated now", registry=self.registry
        )

        self.refused = Counter(
            "sluice_gateway_refused",
            "Requests refused before a replica saw them, by model and reason (quota limits, full queue, "
            "deadline)",
            ["model", "reason"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "sluice_gateway_queue_depth",
            "Requests waiting for dispatch, by model, version, pool and class",
            ["model", "version", "pool", "request_class"],
            registry=self.registry,
        )
        self.queue_age_s = Gauge(
            "sluice_gateway_queue_age_seconds",
            "How long the oldest request still waiting for dispatch has waited (0: none waits), by model, "
            "version, pool and class",
            ["model", "version", "pool", "request_class"],
            registry=self.registry,
        )
        self.admitted = Counter(
            "sluice_gateway_admitted",
            "Requests dispatched from the queue to a replica (first dispatch only: re-dispatches count in "
            "sluice_gateway_redispatches), by model, version, pool and class",
            ["model", "version", "pool", "request_class"],
            registry=self.registry,
        )
        self.cancellations = Counter(
            "sluice_gateway_cancellations",
            "Requests whose client went away before they ended (queued or generating), by model, version "
            "and class",
            ["model", "version", "request_class"],
            registry=self.registry,
        )
        self.cancel_to_free_s = Histogram(
            "sluice_gateway_cancel_to_free_seconds",
            "From the gateway learning the client left to the replica slot being released after the engine "
            "call was closed, by model, version and class",
            ["model", "version", "request_class"],
            buckets=_CANCEL_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_wait_s = Histogram(
            "sluice_gateway_queue_wait_seconds",
            "From arrival to dispatch to a replica, by model, version, pool and class",
            ["model", "version", "pool", "request_class"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.replica_kv_free_tokens = Gauge(
            "sluice_gateway_replica_kv_free_tokens",
            "Free KV tokens the replica reported at the last read",
            ["model", "version", "replica"],
            registry=self.registry,
        )
        self.replica_kv_used_ratio = Gauge(
            "sluice_gateway_replica_kv_used_ratio",
            "The replica's KV cache occupancy at the last read: used / total KV tokens (0..1)",
            ["model", "version", "replica"],
            registry=self.registry,
        )
        self.replica_running_cap = Gauge(
            "sluice_gateway_replica_running_cap",
            "How many requests this gateway lets the replica run at once, the batch bounded by the "
            "inter-token target (sluice.policy.batch_bound); 0: not bounded yet",
            ["model", "version", "replica"],
            registry=self.registry,
        )
        self.replica_itl_p95_seconds = Gauge(
            "sluice_gateway_replica_itl_p95_seconds",
            "The p95 of the recent gaps between a stream's deltas from the replica, as this gateway reads "
            "them (what its running cap is judged on)",
            ["model", "version", "replica"],
            registry=self.registry,
        )
        self.redispatches = Counter(
            "sluice_gateway_redispatches",
            "Requests dispatched again after their replica failed before a first token, by model and version",
            ["model", "version"],
            registry=self.registry,
        )
        self.replica_suspensions = Counter(
            "sluice_gateway_replica_suspensions",
            "Replicas this gateway stopped dispatching to after a request could not reach them",
            ["model", "version"],
            registry=self.registry,
        )
        self.registry_generation = Gauge(
            "sluice_gateway_registry_generation",
            "The registry generation this gateway routes by (-1: none read yet; static routing: not set)",
            registry=self.registry,
        )
        self.registry_read_failures = Counter(
            "sluice_gateway_registry_read_failures",
            "Registry reads that failed (the gateway kept routing by its last snapshot)",
            registry=self.registry,
        )
        self.version_fallbacks = Counter(
            "sluice_gateway_version_fallbacks",
            "Requests whose conversation's version had no replica in rotation, served by another version",
            ["model", "version"],
            registry=self.registry,
        )
        self.pool_fallbacks = Counter(
            "sluice_gateway_pool_fallbacks",
            "Requests queued for their version's other pool: the pool their prompt length asks for "
            "(long-prompt or general) had no replica in rotation",
            ["model", "version", "wanted_pool", "pool"],
            registry=self.registry,
        )
        self.quota_fail_open = Counter(
            "sluice_gateway_quota_fail_open",
            "Quota decisions served from the local fallback because the quota store was unreachable",
            registry=self.registry,
        )
        self.tenant_store_down = Gauge(
            "sluice_gateway_tenant_store_down",
            "1 while the tenant store is unavailable (known keys served from the cache, others refused)",
            registry=self.registry,
        )
        self.tenant_stale_resolutions = Counter(
            "sluice_gateway_tenant_stale_resolutions",
            "API keys resolved from a cache entry past its TTL because the tenant store was unavailable",
            registry=self.registry,
        )
        self.tenant_store_lookups = Counter(
            "sluice_gateway_tenant_store_lookups",
            "API key lookups sent to the tenant store (cache misses, after merging concurrent ones)",
            registry=self.registry,
        )

        self.usage_outbox_pending = Gauge(
            "sluice_gateway_usage_outbox_pending",
            "Usage records in the durable outbox that the ledger has not accepted yet",
            registry=self.registry,
        )
        self.usage_records_written = Counter(
            "sluice_gateway_usage_records_written",
            "Usage records the ledger accepted (directly, or replayed from the outbox)",
            registry=self.registry,
        )
        self.usage_ledger_failures = Counter(
            "sluice_gateway_usage_ledger_failures",
            "Ledger writes of usage records that failed or timed out (the record stays in the outbox)",
            registry=self.registry,
        )
        self.telemetry_dropped = Counter(
            "sluice_gateway_telemetry_dropped",
            "Telemetry records a sink did not deliver: its queue was full, or its destination (file, stdout, "
            "Redis) refused them, by sink",
            ["sink"],
            registry=self.registry,
        )

        self.wasted_output_tokens = Counter(
            "sluice_gateway_superseded_output_tokens",
            "Output tokens generated by attempts that a retry with the same Idempotency-Key replaced (waste)",
            registry=self.registry,
        )
        self.filtered = Counter(
            "sluice_gateway_content_filtered",
            "Requests stopped by a safety classifier, by where (input, output) and category",
            ["stage", "category"],
            registry=self.registry,
        )

        self.degraded = Counter(
            "sluice_gateway_degraded",
            "Requests admitted with a fallback of their overloaded model, by that model and fallback "
            "(alias_to, max_tokens_cap, to_batch)",
            ["model", "action"],
            registry=self.registry,
        )
        self.degraded_mode = Gauge(
            "sluice_gateway_degraded_mode",
            "1 while the model is overloaded and its configured fallbacks apply (SLUICE_DEGRADATION)",
            ["model"],
            registry=self.registry,
        )

        # The batch runner (gateway/batches): lines counted once committed, as the batch's own counts are.
        self.batch_lines = Counter(
            "sluice_gateway_batch_lines",
            "Batch lines committed by this gateway's runner, by outcome (completed; failed: answered with "
            "an error; invalid: malformed; cancelled or expired before they finished)",
            ["outcome"],
            registry=self.registry,
        )
        self.batch_line_retries = Counter(
            "sluice_gateway_batch_line_retries",
            "Batch lines refused for now (429 or 503) that waited Retry-After to run again, by the refusal",
            ["reason"],
            registry=self.registry,
        )
        self.batches_active = Gauge(
            "sluice_gateway_batches_active", "Batches this gateway's runner holds now", registry=self.registry
        )
        self.files_expired = Counter(
            "sluice_gateway_files_expired",
            "Expired files this gateway's sweep deleted (one two gateways' sweeps raced on counts on both)",
            registry=self.registry,
        )

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
