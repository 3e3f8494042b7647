"""Write Sluice's Grafana dashboards (the JSON beside this file) from the panel lists below.

    .venv/bin/python deploy/grafana/build_dashboards.py

Edit the lists here and rerun, rather than editing the JSON: tests/deploy/test_dashboards.py checks that
the JSON is what this writes, and that every query names metrics and labels the services export.
Queries use the variables ``$datasource`` (a Prometheus data source), ``$model`` and ``$version``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RATE = "$__rate_interval"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
INTERACTIVE = 'request_class="interactive"'
MV = 'model="$model", version="$version"'


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    unit: str = "short"
    description: str = ""
    kind: str = "timeseries"
    width: int = 12  # of Grafana's 24 columns


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: list[Panel]
    variables: tuple[str, ...] = ()  # "model", "version"
    tags: tuple[str, ...] = field(default=("sluice",))


def p95(histogram: str, by: str, selector: str = "") -> str:
    return f"histogram_quantile(0.95, sum by ({by}, le) (rate({histogram}_bucket{{{selector}}}[{RATE}])))"


TTFT = "sluice_gateway_time_to_first_token_seconds"
ITL = "sluice_gateway_inter_token_seconds"
OUTCOMES = "sluice_gateway_request_outcomes_total"
M = 'model="$model"'

FLEET = Dashboard(
    "sluice-fleet",
    "Sluice / Fleet overview",
    "Every model at once: traffic, client-observed latency against the SLOs, queueing, shedding, replica "
    "health, KV occupancy and cost. Alerts: deploy/prometheus/alert-rules.yml; runbooks: docs/operations.md, "
    '"Dashboards and alerts".',
    [
        Panel(
            "Requests by outcome",
            (
                (
                    f"sum by (model, outcome) (rate(sluice_gateway_request_outcomes_total[{RATE}]))",
                    "{{model}} {{outcome}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Admitted and refused (by reason)",
            (
                (f"sum by (model) (rate(sluice_gateway_admitted_total[{RATE}]))", "admitted {{model}}"),
                (
                    f"sum by (model, reason) (rate(sluice_gateway_refused_total[{RATE}]))",
                    "refused {{model}}: {{reason}}",
                ),
            ),
            "reqps",
            "Refusals are counted by model and reason: quota ones are a tenant's limits, "
            "service_overloaded and deadline_unmeetable are shedding.",
        ),
        Panel(
            "TTFT p95, interactive (SLO: 99% within 1.28 s)",
            ((p95(TTFT, "model", INTERACTIVE), "{{model}}"),),
            "s",
        ),
        Panel(
            "Inter-token p95, interactive (SLO: 99% within 0.16 s)",
            ((p95(ITL, "model", INTERACTIVE), "{{model}}"),),
            "s",
        ),
        Panel(
            "SLO error ratio, last hour",
            (
                ("max by (model) (sluice:ttft_slo_errors:ratio_rate1h)", "TTFT {{model}}"),
                ("max by (model) (sluice:itl_slo_errors:ratio_rate1h)", "inter-token {{model}}"),
            ),
            "percentunit",
            "Burn-rate alerts fire at 14.4% (1 h) and 6% (6 h) against a 1% budget.",
        ),
        Panel(
            "Shed ratio",
            (("sluice:shed:ratio_rate5m", "shed"),),
            "percentunit",
            "Capacity refusals / (admitted + capacity refusals); alert above 5% for 10 minutes.",
        ),
        Panel(
            "Queue depth",
            (("sum by (model, request_class) (sluice_gateway_queue_depth)", "{{model}} {{request_class}}"),),
        ),
        Panel(
            "Queue age (oldest waiting request)",
            (
                (
                    "max by (model, request_class) (sluice_gateway_queue_age_seconds)",
                    "{{model}} {{request_class}}",
                ),
            ),
            "s",
            "Alert: interactive over 10 s for 2 minutes.",
        ),
        Panel(
            "Output tokens per second",
            (
                (
                    f"sum by (model, request_class) (rate(sluice_gateway_output_tokens_total[{RATE}]))",
                    "{{model}} {{request_class}}",
                ),
            ),
            "short",
        ),
        Panel(
            "Cost per million output tokens (last hour)",
            (("sluice:cost_per_million_output_tokens_usd", "{{model}}"),),
            "currencyUSD",
            "Replicas (every state but stopped) x SLUICE_REPLICA_HOUR_PRICE_USD / output tokens "
            "per hour x 1e6. Empty while the price is unset.",
        ),
        Panel(
            "Replicas by state",
            (("sum by (model, state) (sluice_control_plane_version_replicas)", "{{model}} {{state}}"),),
        ),
        Panel(
            "KV cache occupancy by replica",
            (
                (
                    "max by (model, version, replica) (sluice_gateway_replica_kv_used_ratio)",
                    "{{model}} v{{version}} {{replica}}",
                ),
            ),
            "percentunit",
            "As the gateways last read each replica's Triton metrics.",
        ),
        Panel(
            "Preemptions per second by replica",
            (
                (
                    f"sum by (model, version, instance) (rate(sluice_engine_preemptions_total[{RATE}]))",
                    "{{model}} v{{version}} {{instance}}",
                ),
            ),
            "short",
            "The CPU engine's own counter, scraped from each replica's Triton metrics port. "
            "TensorRT-LLM replicas export no preemption count.",
        ),
        Panel(
            "Cancellations and cancel-to-free p95",
            (
                (
                    f"sum by (model) (rate(sluice_gateway_cancellations_total[{RATE}]))",
                    "cancelled/s {{model}}",
                ),
                (p95("sluice_gateway_cancel_to_free_seconds", "model"), "cancel-to-free p95 {{model}} (s)"),
            ),
            "short",
            "From the gateway learning the client left to the replica slot being free.",
        ),
        Panel(
            "Batch API: lines committed per second by outcome, batches held",
            (
                (f"sum by (outcome) (rate(sluice_gateway_batch_lines_total[{RATE}]))", "{{outcome}}/s"),
                ("sum(sluice_gateway_batches_active)", "batches held by runners"),
            ),
            "short",
            "The gateways' batch runners: lines counted when committed (as the batches' own counts are). "
            "A batch's progress is GET /v1/batches/{id}; retries waiting out a refusal are "
            "sluice_gateway_batch_line_retries_total.",
        ),
        Panel(
            "GPU utilisation (diagnostic)",
            (("avg by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "{{Hostname}} GPU {{gpu}}"),),
            "percent",
            "From NVIDIA's DCGM exporter, where it runs. A diagnostic, never an alert: a busy "
            "GPU is what the fleet is paid for; latency, queue age and KV occupancy say whether it is full.",
            width=24,
        ),
    ],
)

VERSION = Dashboard(
    "sluice-model-version",
    "Sluice / Model version",
    "One model version from the gateway's queue to its replicas' KV cache: latency by class, queueing by "
    "pool, replica load, preemptions and failover.",
    [
        Panel(
            "TTFT p50 / p95 / p99 by class",
            tuple(
                (
                    f"histogram_quantile({q}, sum by (request_class, le) "
                    f"(rate({TTFT}_bucket{{{MV}}}[{RATE}])))",
                    f"p{round(q * 100)} {{{{request_class}}}}",
                )
                for q in (0.5, 0.95, 0.99)
            ),
            "s",
        ),
        Panel("Inter-token p95 by class", ((p95(ITL, "request_class", MV), "{{request_class}}"),), "s"),
        Panel(
            "Queue wait p95 by pool and class",
            (
                (
                    p95("sluice_gateway_queue_wait_seconds", "pool, request_class", MV),
                    "{{pool}} {{request_class}}",
                ),
            ),
            "s",
        ),
        Panel(
            "Queue depth and age by pool and class",
            (
                (
                    f"sum by (pool, request_class) (sluice_gateway_queue_depth{{{MV}}})",
                    "depth {{pool}} {{request_class}}",
                ),
                (
                    f"max by (pool, request_class) (sluice_gateway_queue_age_seconds{{{MV}}})",
                    "age (s) {{pool}} {{request_class}}",
                ),
            ),
        ),
        Panel(
            "Tokens per second by class",
            (
                (
                    f"sum by (request_class) (rate(sluice_gateway_output_tokens_total{{{MV}}}[{RATE}]))",
                    "output {{request_class}}",
                ),
                (
                    f"sum by (request_class) (rate(sluice_gateway_prompt_tokens_total{{{MV}}}[{RATE}]))",
                    "prompt {{request_class}}",
                ),
            ),
        ),
        Panel(
            "Outcomes",
            (
                (
                    f"sum by (outcome) (rate(sluice_gateway_request_outcomes_total{{{MV}}}[{RATE}]))",
                    "{{outcome}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "KV cache occupancy by replica",
            ((f"max by (replica) (sluice_gateway_replica_kv_used_ratio{{{MV}}})", "{{replica}}"),),
            "percentunit",
        ),
        Panel(
            "Running and waiting in each replica",
            (
                (
                    f"sum by (instance, request_type) "
                    f'(nv_trt_llm_request_metrics{{{MV}, request_type=~"active|waiting"}})',
                    "{{instance}} {{request_type}}",
                ),
            ),
            "short",
            "The replica's own view (Triton metrics): active includes waiting.",
        ),
        Panel(
            "Preemptions per second",
            ((f"sum by (instance) (rate(sluice_engine_preemptions_total{{{MV}}}[{RATE}]))", "{{instance}}"),),
            "short",
            "CPU engine replicas only.",
        ),
        Panel(
            "Engine step time (mean) and prefix cache hit ratio",
            (
                (
                    f"sum by (instance) (rate(sluice_engine_step_ms_total{{{MV}}}[{RATE}])) / "
                    f"sum by (instance) (rate(sluice_engine_steps_total{{{MV}}}[{RATE}]))",
                    "step ms {{instance}}",
                ),
                (
                    f"sum by (instance) (rate(sluice_prefix_cache_hit_tokens_total{{{MV}}}[{RATE}])) / "
                    f"sum by (instance) (rate(sluice_prefix_cache_query_tokens_total{{{MV}}}[{RATE}]))",
                    "prefix hit ratio {{instance}}",
                ),
            ),
        ),
        Panel(
            "Replicas by pool and state",
            (
                (
                    f"sum by (pool, state) (sluice_control_plane_version_replicas{{{MV}}})",
                    "{{pool}} {{state}}",
                ),
            ),
        ),
        Panel(
            "Failover: re-dispatches and replica suspensions",
            (
                (f"sum (rate(sluice_gateway_redispatches_total{{{MV}}}[{RATE}]))", "re-dispatched/s"),
                (f"sum (rate(sluice_gateway_replica_suspensions_total{{{MV}}}[{RATE}]))", "suspended/s"),
            ),
        ),
    ],
    variables=("model", "version"),
)

TENANTS = Dashboard(
    "sluice-tenants",
    "Sluice / Tenants",
    "Tenants are not a metric label (one series per tenant per label set would grow without bound). "
    "Per-tenant numbers come from the usage ledger (GET /v1/usage: a tenant's own totals and rows; "
    "`sluice usage` for operators) and the telemetry stream (one record per request with tenant_id, "
    'docs/operations.md "Telemetry"). This dashboard shows what tenants do to the fleet: refusals by '
    "reason (quota ones are a tenant's limits), usage by class, degradation and content filtering.",
    [
        Panel(
            "Refusals by reason",
            ((f"sum by (reason) (rate(sluice_gateway_refused_total[{RATE}]))", "{{reason}}"),),
            "reqps",
            "tokens_per_minute_exceeded, concurrency and budget reasons are tenants' own limits.",
        ),
        Panel(
            "Output tokens per second by class",
            (
                (
                    f"sum by (model, request_class) (rate(sluice_gateway_output_tokens_total[{RATE}]))",
                    "{{model}} {{request_class}}",
                ),
            ),
        ),
        Panel(
            "Prompt tokens per second by class",
            (
                (
                    f"sum by (model, request_class) (rate(sluice_gateway_prompt_tokens_total[{RATE}]))",
                    "{{model}} {{request_class}}",
                ),
            ),
        ),
        Panel(
            "Degraded admissions (fallbacks under overload)",
            (
                (
                    f"sum by (model, action) (rate(sluice_gateway_degraded_total[{RATE}]))",
                    "{{model}} {{action}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Content filtered",
            (
                (
                    f"sum by (stage, category) (rate(sluice_gateway_content_filtered_total[{RATE}]))",
                    "{{stage}} {{category}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Retries: superseded output tokens",
            ((f"sum (rate(sluice_gateway_superseded_output_tokens_total[{RATE}]))", "wasted tokens/s"),),
            "short",
            "Tokens of attempts a retry with the same Idempotency-Key replaced.",
        ),
        Panel(
            "Usage ledger: outbox pending and failures",
            (
                ("sum (sluice_gateway_usage_outbox_pending)", "outbox pending"),
                (f"sum (rate(sluice_gateway_usage_ledger_failures_total[{RATE}]))", "ledger failures/s"),
            ),
            "short",
            "Usage not yet in the ledger is not yet in GET /v1/usage.",
        ),
        Panel(
            "Tenant store",
            (
                ("max (sluice_gateway_tenant_store_down)", "store down"),
                (f"sum (rate(sluice_gateway_tenant_stale_resolutions_total[{RATE}]))", "stale resolutions/s"),
            ),
        ),
    ],
)

ROLLOUT = Dashboard(
    "sluice-rollout",
    "Sluice / Rollout comparison",
    "A model's versions side by side during a canary: interactive TTFT p95, inter-token p95, error rate "
    "and traffic share per version. A canary is good when its lines sit on the stable version's.",
    [
        Panel(
            "TTFT p95 by version (interactive)",
            (('sluice:ttft_seconds:p95_5m{model="$model", request_class="interactive"}', "v{{version}}"),),
            "s",
        ),
        Panel(
            "Inter-token p95 by version (interactive)",
            (('sluice:itl_seconds:p95_5m{model="$model", request_class="interactive"}', "v{{version}}"),),
            "s",
        ),
        Panel(
            "Error rate by version",
            (
                (
                    f'sum by (version) (rate({OUTCOMES}{{{M}, outcome="failed"}}[{RATE}]))'
                    f" / sum by (version) (rate({OUTCOMES}{{{M}}}[{RATE}]))",
                    "v{{version}}",
                ),
            ),
            "percentunit",
            "Failed (replica or engine errors) over every request that reached the version.",
        ),
        Panel(
            "Traffic share by version",
            (
                (
                    f"sum by (version) (rate({OUTCOMES}{{{M}}}[{RATE}]))"
                    f" / scalar(sum (rate({OUTCOMES}{{{M}}}[{RATE}])))",
                    "v{{version}}",
                ),
            ),
            "percentunit",
        ),
        Panel(
            "Cancellations by version",
            (
                (
                    f'sum by (version) (rate(sluice_gateway_cancellations_total{{model="$model"}}[{RATE}]))',
                    "v{{version}}",
                ),
            ),
            "reqps",
            "Clients leaving more on one version can mean its output is worse, not only slower.",
        ),
        Panel(
            "SLO error ratio (1 h) by version",
            (
                ('sluice:ttft_slo_errors:ratio_rate1h{model="$model"}', "TTFT v{{version}}"),
                ('sluice:itl_slo_errors:ratio_rate1h{model="$model"}', "inter-token v{{version}}"),
            ),
            "percentunit",
        ),
    ],
    variables=("model",),
)

DASHBOARDS = (FLEET, VERSION, TENANTS, ROLLOUT)


def _variable(name: str) -> dict[str, Any]:
    match = {"model": "", "version": ', model="$model"'}[name]
    query = f"label_values(sluice_gateway_time_to_first_token_seconds_count{{{match.lstrip(', ')}}}, {name})"
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": f"{name}-values"},
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "includeAll": False,
        "multi": False,
    }


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(panel.queries)
        ],
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (importable as is; the data source chosen on import)."""
    panels, x, y = [], 0, 0
    for panel_id, panel in enumerate(dashboard.panels, start=1):
        if x + panel.width > 24:
            x, y = 0, y + 8
        panels.append(_panel(panel, panel_id, x, y))
        x += panel.width
    datasource = {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [datasource, *(_variable(name) for name in dashboard.variables)]},
        "panels": panels,
    }


def rendered() -> dict[Path, str]:
    """File -> its JSON text, for every dashboard."""
    return {HERE / f"{d.uid}.json": json.dumps(render(d), indent=2) + "\n" for d in DASHBOARDS}


def main() -> int:
    for path, text in rendered().items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
