"""The gateway's Prometheus metrics, in a registry of its own (one per app, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sluice_gateway_requests",
            "Requests by route, HTTP status code and outcome (rejected before the engine, or how it ended)",
            ["route", "status_code", "outcome"],
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
            "sluice_gateway_prompt_tokens", "Prompt tokens sent to a replica", registry=self.registry
        )
        self.output_tokens = Counter(
            "sluice_gateway_output_tokens", "Output tokens received from a replica", registry=self.registry
        )
        self.in_flight = Gauge(
            "sluice_gateway_requests_in_flight", "Requests being generated now", registry=self.registry
        )

        self.refused = Counter(
            "sluice_gateway_refused",
            "Requests refused before a replica saw them, by reason (quota limits, full queue, deadline)",
            ["reason"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "sluice_gateway_queue_depth",
            "Requests waiting for dispatch, by model, version, pool and class",
            ["model", "version", "pool", "request_class"],
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

    def count_refused(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def count_rejected(self, route: str, status_code: int) -> None:
        self.requests.labels(route, str(status_code), "rejected").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
