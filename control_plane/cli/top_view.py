"""What ``sluice top`` shows, from what it read: the admin API's replica list and two scrapes of each source
(every replica's metrics URL, every gateway's ``/metrics``) turned into one row per model version and one
per replica (``top_render`` prints them). Pure: no I/O, no clock (``top.py`` reads the sources).

Per replica, from its own metrics (the TensorRT-LLM backend's families, which the CPU engine exports under
the same names): requests running and waiting (``nv_trt_llm_request_metrics``), KV blocks in use
(``nv_trt_llm_kv_cache_block_metrics``), tokens/s (the CPU engine's ``sluice_engine_generated_tokens``
counter) and TTFT p95 when Triton exports its first-response histogram. Per version: the sums over its
replicas, requests queued at the gateways (``sluice_gateway_queue_depth``), and TTFT and inter-token p95
from the gateways' histograms (every request class); tokens/s from the gateways' histogram counts when no
replica reports it. Rates and percentiles cover the window between the
two scrapes; a source read once only (the first refresh) shows ``-`` there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from control_plane.metrics_text import (
    Metrics,
    bucket_counts,
    bucket_increase,
    histogram_quantile,
    increase,
    sum_buckets,
)

GATEWAY_TTFT = "sluice_gateway_time_to_first_token_seconds"
GATEWAY_ITL = "sluice_gateway_inter_token_seconds"
GATEWAY_QUEUE_DEPTH = "sluice_gateway_queue_depth"
GATEWAY_OUTPUT_TOKENS = "sluice_gateway_output_tokens_total"
GATEWAY_REFUSED = "sluice_gateway_refused_total"
GATEWAY_BATCHES_ACTIVE = "sluice_gateway_batches_active"
GATEWAY_BATCH_LINES = "sluice_gateway_batch_lines_total"
REPLICA_REQUESTS = "nv_trt_llm_request_metrics"
REPLICA_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
REPLICA_TOKENS = "sluice_engine_generated_tokens_total"
# Triton's per-model first-response latency (decoupled models), with --metrics-config histogram_latencies.
REPLICA_TTFT_MS = "nv_inference_first_response_histogram_ms"
QUANTILE = 0.95


@dataclass(frozen=True)
class Scrape:
    """One read of one source: its samples, or why there are none."""

    url: str
    at_s: float  # monotonic seconds, when the answer came
    metrics: Metrics | None
    error: str | None = None  # in words, when metrics is None


@dataclass(frozen=True)
class Window:
    """Two reads of one source; ``before`` is None on the first refresh."""

    before: Scrape | None
    after: Scrape

    @property
    def span_s(self) -> float | None:
        both = self.both()
        return None if both is None else both[2]

    def both(self) -> tuple[Metrics, Metrics, float] | None:
        """(before, after, seconds between them) when both reads succeeded; None otherwise."""
        if self.before is None or self.before.metrics is None or self.after.metrics is None:
            return None
        span_s = self.after.at_s - self.before.at_s
        return (self.before.metrics, self.after.metrics, span_s) if span_s > 0 else None


@dataclass(frozen=True)
class Sources:
    """Everything one refresh read."""

    admin_url: str
    replicas: list[dict[str, Any]] | None  # the admin API's replica views; None: not read
    admin_error: str | None
    replica_windows: dict[str, Window]  # by metrics URL
    gateway_windows: list[Window]


@dataclass(frozen=True)
class TopRow:
    """A version's row (``replica`` "") or a replica's; None: not known in this window."""

    model: str
    version: str
    replica: str
    state: str  # a replica's registry state; a version's "N/M ready"
    num_running: int | None
    num_waiting: int | None  # at the replica(s)
    num_queued: int | None  # at the gateways, not yet dispatched (version rows)
    kv_used_pct: float | None
    ttft_p95_ms: float | None
    itl_p95_ms: float | None
    tokens_per_s: float | None
    health: str  # the registry's last health detail, and why metrics are missing


@dataclass(frozen=True)
class SourceStatus:
    kind: str  # admin, gateway, replica
    url: str
    error: str | None  # None: read


@dataclass(frozen=True)
class Snapshot:
    rows: list[TopRow]
    sources: list[SourceStatus]
    window_s: float | None  # the widest window a rate covers; None on a first read
    gateway_output_tokens_per_s: float | None  # every model, summed over the gateways
    notes: list[str] = field(default_factory=list)
    # Summed over the gateways (None: none reported it): requests refused before a replica (quota limits
    # and shedding), batches their runners hold now, and batch lines committed.
    gateway_refused_per_s: float | None = None
    gateway_batches_active: int | None = None
    gateway_batch_lines_per_s: float | None = None


# ------------------------------------------------------------------------------------------ replicas


@dataclass(frozen=True)
class _ReplicaFigures:
    """What a replica's metrics said (None: not said), kept raw for its version's sums."""

    num_running: float | None = None
    num_waiting: float | None = None
    num_kv_blocks_used: float | None = None
    num_kv_blocks_max: float | None = None
    tokens_per_s: float | None = None
    ttft_p95_ms: float | None = None


def _replica_figures(window: Window, model: str) -> _ReplicaFigures:
    after = window.after.metrics
    assert after is not None
    active = after.total(REPLICA_REQUESTS, model=model, request_type="active")
    waiting = after.total(REPLICA_REQUESTS, model=model, request_type="waiting")
    tokens_per_s = ttft_ms = None
    both = window.both()
    if both is not None:
        before, _, span_s = both
        num_tokens = increase(
            before.total(REPLICA_TOKENS, model=model), after.total(REPLICA_TOKENS, model=model)
        )
        tokens_per_s = None if num_tokens is None else num_tokens / span_s
        ttft_ms = histogram_quantile(
            QUANTILE,
            bucket_increase(
                bucket_counts(before, REPLICA_TTFT_MS, model=model),
                bucket_counts(after, REPLICA_TTFT_MS, model=model),
            ),
        )
    return _ReplicaFigures(
        num_running=None if active is None or waiting is None else active - waiting,
        num_waiting=waiting,
        num_kv_blocks_used=after.total(REPLICA_KV_BLOCKS, model=model, kv_cache_block_type="used"),
        num_kv_blocks_max=after.total(REPLICA_KV_BLOCKS, model=model, kv_cache_block_type="max"),
        tokens_per_s=tokens_per_s,
        ttft_p95_ms=ttft_ms,
    )


def _replica_row(replica: dict[str, Any], window: Window | None) -> tuple[TopRow, _ReplicaFigures]:
    """The replica's row, and its raw figures (for its version's sums)."""
    health = replica["health_detail"] or ""
    figures = _ReplicaFigures()
    if window is None:
        health = _join(health, "no metrics URL")
    elif window.after.metrics is None:
        health = _join(health, f"metrics: {window.after.error}")
    else:
        figures = _replica_figures(window, replica["model"])
    row = TopRow(
        model=replica["model"],
        version=replica["version"],
        replica=replica["replica_id"],
        state=str(replica["state"]),
        num_running=_int(figures.num_running),
        num_waiting=_int(figures.num_waiting),
        num_queued=None,
        kv_used_pct=_pct(figures.num_kv_blocks_used, figures.num_kv_blocks_max),
        ttft_p95_ms=figures.ttft_p95_ms,
        itl_p95_ms=None,
        tokens_per_s=figures.tokens_per_s,
        health=health,
    )
    return row, figures


# ------------------------------------------------------------------------------------------ gateways


def _gateway_latency_ms(windows: list[Window], histogram: str, model: str, version: str) -> float | None:
    """The p95 over every gateway's buckets' increase in its window (all request classes)."""
    increases = [
        bucket_increase(
            bucket_counts(before, histogram, model=model, version=version),
            bucket_counts(after, histogram, model=model, version=version),
        )
        for before, after, _ in filter(None, (window.both() for window in windows))
    ]
    seconds = histogram_quantile(QUANTILE, sum_buckets(increases))
    return None if seconds is None else seconds * 1000


def _gateway_versions(windows: list[Window]) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for window in windows:
        if window.after.metrics is not None:
            for name in (f"{GATEWAY_TTFT}_count", GATEWAY_QUEUE_DEPTH):
                found |= {(m, v) for m, v in window.after.metrics.label_values(name, "model", "version")}
    return {(m, v) for m, v in found if m and v}


def _gateway_tokens_per_s(windows: list[Window], model: str, version: str) -> float | None:
    """Output tokens of the version's requests that ended in each gateway's window, per second: one TTFT
    and one inter-token observation per token (a request's first token, then one gap per token)."""
    rates = []
    for window in windows:
        both = window.both()
        if both is None:
            continue
        before, after, span_s = both
        num_tokens = _sum(
            increase(
                before.total(name, model=model, version=version),
                after.total(name, model=model, version=version),
            )
            for name in (f"{GATEWAY_TTFT}_count", f"{GATEWAY_ITL}_count")
        )
        rates.append(None if num_tokens is None else num_tokens / span_s)
    return _sum(rates)


def _queued(windows: list[Window], model: str, version: str) -> int | None:
    totals = [
        w.after.metrics.total(GATEWAY_QUEUE_DEPTH, model=model, version=version)
        for w in windows
        if w.after.metrics is not None
    ]
    return _int(_sum(totals))


def _gateway_rate(windows: list[Window], counter: str) -> float | None:
    """``counter``'s increase per second over each gateway's window (every label), summed."""
    rates = []
    for window in windows:
        both = window.both()
        if both is not None:
            before, after, span_s = both
            num = increase(before.total(counter), after.total(counter))
            rates.append(None if num is None else num / span_s)
    return _sum(rates)


def _gateway_gauge(windows: list[Window], gauge: str) -> int | None:
    """``gauge`` as each gateway's latest read says, summed."""
    return _int(_sum(w.after.metrics.total(gauge) for w in windows if w.after.metrics is not None))


# ------------------------------------------------------------------------------------------ snapshot


def build_snapshot(sources: Sources, model: str | None = None) -> Snapshot:
    """Rows ordered by model, version (numbers by value), each version's row before its replicas';
    only ``model``'s when given (the gateways report every model)."""
    replica_rows: dict[tuple[str, str], list[tuple[TopRow, _ReplicaFigures]]] = defaultdict(list)
    for replica in sources.replicas or []:
        window = sources.replica_windows.get(replica["metrics_url"]) if replica["metrics_url"] else None
        row, figures = _replica_row(replica, window)
        replica_rows[(row.model, row.version)].append((row, figures))
    gateways = sources.gateway_windows
    rows: list[TopRow] = []
    versions = set(replica_rows) | _gateway_versions(gateways)
    for name, version in sorted(versions, key=_version_order):
        if model is not None and name != model:
            continue
        members = sorted(replica_rows.get((name, version), []), key=lambda pair: pair[0].replica)
        rows.append(_version_row(name, version, members, gateways))
        rows.extend(row for row, _ in members)
    windows = [*sources.replica_windows.values(), *gateways]
    spans = [w.span_s for w in windows if w.span_s is not None]
    read_once = not spans and any(w.after.metrics is not None for w in windows)
    return Snapshot(
        rows=rows,
        sources=_statuses(sources),
        window_s=max(spans) if spans else None,
        gateway_output_tokens_per_s=_gateway_rate(gateways, GATEWAY_OUTPUT_TOKENS),
        notes=["rates and p95s need a second read: they show from the next refresh"] if read_once else [],
        gateway_refused_per_s=_gateway_rate(gateways, GATEWAY_REFUSED),
        gateway_batches_active=_gateway_gauge(gateways, GATEWAY_BATCHES_ACTIVE),
        gateway_batch_lines_per_s=_gateway_rate(gateways, GATEWAY_BATCH_LINES),
    )


def _version_row(
    model: str, version: str, members: list[tuple[TopRow, _ReplicaFigures]], gateways: list[Window]
) -> TopRow:
    figures = [f for _, f in members]
    num_ready = sum(1 for row, _ in members if row.state == "ready")
    return TopRow(
        model=model,
        version=version,
        replica="",
        state=f"{num_ready}/{len(members)} ready" if members else "no replicas",
        num_running=_int(_sum(f.num_running for f in figures)),
        num_waiting=_int(_sum(f.num_waiting for f in figures)),
        num_queued=_queued(gateways, model, version),
        kv_used_pct=_pct(
            _sum(f.num_kv_blocks_used for f in figures), _sum(f.num_kv_blocks_max for f in figures)
        ),
        ttft_p95_ms=_gateway_latency_ms(gateways, GATEWAY_TTFT, model, version),
        itl_p95_ms=_gateway_latency_ms(gateways, GATEWAY_ITL, model, version),
        tokens_per_s=_version_tokens_per_s(figures, gateways, model, version),
        health="",
    )


def _version_tokens_per_s(
    figures: list[_ReplicaFigures], gateways: list[Window], model: str, version: str
) -> float | None:
    """Its replicas' tokens/s summed (live: tokens as they are made), else, when no replica reports one
    (TensorRT-LLM exports no token counter), the gateways' count of tokens of requests that ended."""
    from_replicas = _sum(f.tokens_per_s for f in figures)
    return from_replicas if from_replicas is not None else _gateway_tokens_per_s(gateways, model, version)


def _statuses(sources: Sources) -> list[SourceStatus]:
    statuses = [SourceStatus("admin", sources.admin_url, sources.admin_error)]
    statuses += [SourceStatus("gateway", w.after.url, w.after.error) for w in sources.gateway_windows]
    statuses += [
        SourceStatus("replica", url, w.after.error) for url, w in sorted(sources.replica_windows.items())
    ]
    return statuses


# ------------------------------------------------------------------------------------------ helpers


def _version_order(key: tuple[str, str]) -> tuple[str, bool, int, str]:
    """Numbered versions by number (2 before 10), then named ones by name."""
    model, version = key
    numbered = version.isdigit()
    return (model, not numbered, int(version) if numbered else 0, version)


def _sum(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)


def _pct(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else 100 * part / whole


def _join(first: str, second: str) -> str:
    return f"{first}; {second}" if first else second
