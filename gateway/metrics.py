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
            "From the request's arrival to its first output token",
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.inter_token_s = Histogram(
            "sluice_gateway_inter_token_seconds",
            "Time between output tokens",
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
            "Requests waiting for dispatch, by class",
            ["request_class"],
            registry=self.registry,
        )
        self.queue_wait_s = Histogram(
            "sluice_gateway_queue_wait_seconds",
            "From arrival to dispatch to a replica, by class",
            ["request_class"],
            buckets=_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.replica_kv_free_tokens = Gauge(
            "sluice_gateway_replica_kv_free_tokens",
            "Free KV tokens the replica reported at the last read",
            registry=self.registry,
        )
        self.quota_fail_open = Counter(
            "sluice_gateway_quota_fail_open",
            "Quota decisions served from the local fallback because the quota store was unreachable",
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

    def count_refused(self, reason: str) -> None:
        self.refused.labels(reason).inc()

    def count_rejected(self, route: str, status_code: int) -> None:
        self.requests.labels(route, str(status_code), "rejected").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
