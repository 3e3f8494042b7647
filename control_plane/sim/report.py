"""What a run measured: the summary (JSON) and the figures (PNG), over the arrivals after warm-up.

Definitions (also written into every summary's ``definitions``):

- TTFT: first output token's time minus arrival (queue wait + prefill), interactive requests only.
- inter-token latency: each decode token's gap is the duration of the step that produced it; the p95 is
  over tokens (steps weighted by how many decode tokens they emitted), steps ending after warm-up.
- utilisation: achieved output tokens/s / (replicas x the replica's peak output tokens/s at the ITL target
  for the seed's token mix, from the roofline): "percent of peak achievable".
- shed rate: refused (at admission or at the head of the queue) / arrived, by reason.
- served past deadline: finished after its deadline (counted per class).
- cost per million output tokens: replicas x GPUs per replica x $/GPU-hour over the tokens produced.
- with the autoscaler, "replicas" in utilisation and cost is the mean number paid for over the window
  (routed, warm, starting and draining alike: a warm replica holds its GPUs).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from control_plane.sim.fleet import FleetRun
from control_plane.sim.workload import DEADLINE_AT_HEAD, SEED_OUTPUT_TOKENS, SEED_PROMPT_TOKENS
from sluice.domain import Outcome, RequestClass

DEFINITIONS = {
    "ttft": "first output token time - arrival (queue wait + prefill), interactive requests",
    "itl": "per decode token: the duration of the step that produced it; steps weighted by decode tokens",
    "utilisation": "output tokens/s / (replicas x roofline peak output tokens/s per replica at the ITL "
    "target for 1000 prompt / 300 output tokens): percent of peak achievable",
    "shed_rate": "refused (at admission or dropped at the head) / arrived, by reason",
    "served_past_deadline": "finished after its deadline",
    "cost_per_m_output_tokens_usd": "replicas x GPUs per replica x $/GPU-hour / output tokens per hour x 1e6",
    "window": "arrivals in [warmup_s, duration_s); steps ending in the same window",
    "replicas_paid_mean": "autoscaled runs: mean replicas holding GPUs (routed, warm, starting, "
    "draining) over the window; utilisation and cost use it",
}


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    if len(values) == 0 or float(weights.sum()) <= 0:
        return None
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    index = int(np.searchsorted(cum, q * cum[-1]))
    return float(values[order][min(index, len(values) - 1)])


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q * 100, method="higher")) if values else None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 2)


def summarize(run: FleetRun) -> dict[str, Any]:
    config, cal = run.config, run.calibration
    start_s, end_s = config.warmup_s, config.duration_s
    window = [r for r in run.requests if start_s <= r.arrival_s < end_s]
    interactive = [r for r in window if r.request_class is RequestClass.INTERACTIVE]
    ttfts = [r.first_token_s - r.arrival_s for r in interactive if r.first_token_s is not None]
    by_tenant: dict[str, list[float]] = defaultdict(list)
    for r in interactive:
        if r.first_token_s is not None:
            by_tenant[r.tenant_id].append(r.first_token_s - r.arrival_s)
    step_end = np.frombuffer(run.step_end_s, dtype=np.float64)
    in_window = (step_end >= start_s) & (step_end < end_s)
    durations = np.frombuffer(run.step_duration_s, dtype=np.float64)[in_window]
    num_decode = np.frombuffer(run.step_num_decode, dtype=np.float64)[in_window]
    num_emitted = np.frombuffer(run.step_num_emitted, dtype=np.float64)[in_window]
    span_s = end_s - start_s
    output_tokens_per_s = float(num_emitted.sum()) / span_s
    peak = cal.peak_output_tokens_per_s(SEED_PROMPT_TOKENS, SEED_OUTPUT_TOKENS, config.itl_target_s)
    # "open": still queued or running when the run ended (no outcome yet)
    outcomes = Counter("open" if r.outcome is None else r.outcome.value for r in window)
    shed = Counter(r.reason for r in window if r.outcome is Outcome.REFUSED)
    refused_at_admission = [
        r for r in window if r.outcome is Outcome.REFUSED and r.reason != DEADLINE_AT_HEAD
    ]
    past_deadline = Counter(
        r.request_class.value
        for r in window
        if r.outcome is Outcome.FINISHED and r.finish_s is not None and r.finish_s > r.deadline_s
    )
    paid = _replicas_paid(run)
    gpu_usd_per_s = paid * cal.gpus_per_replica * cal.gpu_hour_usd / 3600.0
    return {
        "replicas": config.num_replicas,
        **_scaling_summary(run),
        "fair_queue": "wfq" if config.fair else "fcfs",
        "seed": config.seed,
        "duration_s": config.duration_s,
        "warmup_s": config.warmup_s,
        "num_arrived": len(window),
        "outcomes": dict(sorted(outcomes.items())),
        "ttft_p50_ms": _ms(_percentile(ttfts, 0.50)),
        "ttft_p95_ms": _ms(_percentile(ttfts, 0.95)),
        "itl_p50_ms": _ms(weighted_percentile(durations, num_decode, 0.50)),
        "itl_p95_ms": _ms(weighted_percentile(durations, num_decode, 0.95)),
        "output_tokens_per_s": round(output_tokens_per_s, 1),
        "peak_output_tokens_per_s_per_replica": round(peak, 1),
        "utilisation": round(output_tokens_per_s / (paid * peak), 4),
        "tenant_ttft_p95_ms": {t: _ms(_percentile(v, 0.95)) for t, v in sorted(by_tenant.items())},
        "shed_rate": round(sum(shed.values()) / max(1, len(window)), 4),
        "shed_rate_by_reason": {k: round(v / max(1, len(window)), 4) for k, v in sorted(shed.items())},
        "num_shed_by_reason": dict(sorted(shed.items())),
        "served_past_deadline": dict(sorted(past_deadline.items())),
        "every_refusal_has_retry_after": all(
            r.retry_after_s is not None and r.retry_after_s > 0 for r in refused_at_admission
        ),
        "cost_per_m_output_tokens_usd": (
            round(gpu_usd_per_s / output_tokens_per_s * 1e6, 3) if output_tokens_per_s > 0 else None
        ),
        "definitions": DEFINITIONS,
    }


def _replicas_paid(run: FleetRun) -> float:
    """The fleet size utilisation and cost divide by: fixed, or the autoscaled mean over the window."""
    if run.scaler is None:
        return float(run.config.num_replicas)
    in_window = [
        s.num_provisioned for s in run.scaler.samples if run.config.warmup_s <= s.t_s < run.config.duration_s
    ]
    return sum(in_window) / len(in_window) if in_window else float(run.config.num_replicas)


def _scaling_summary(run: FleetRun) -> dict[str, Any]:
    if run.scaler is None:
        return {}
    samples, decisions = run.scaler.samples, run.scaler.decisions
    counts = Counter(f"{d.direction.value}:{d.reason_code.value}" for _, d in decisions)
    return {
        "replicas_paid_mean": round(_replicas_paid(run), 2),
        "replicas_routed_max": max((s.num_routed for s in samples), default=run.config.num_replicas),
        "warm_pool_at_end": samples[-1].num_warm if samples else None,
        "autoscaler_decisions": dict(sorted(counts.items())),
        "autoscaler_actions": [
            {"t_s": round(t, 1), "reason": d.reason}
            for t, d in decisions
            if d.num_promote or d.num_cold_start or d.num_drain or d.num_demote or d.num_warm_start
        ],
    }


def time_series(run: FleetRun) -> dict[str, list[float]]:
    """Per second of simulated time: TTFT p50/p95 by arrival, ITL p95 and output tokens by step end."""
    seconds = int(run.config.duration_s)
    ttft: list[list[float]] = [[] for _ in range(seconds)]
    for r in run.requests:
        if r.request_class is RequestClass.INTERACTIVE and r.first_token_s is not None:
            second = int(r.arrival_s)
            if second < seconds:
                ttft[second].append(r.first_token_s - r.arrival_s)
    step_end = np.frombuffer(run.step_end_s, dtype=np.float64)
    second_of = step_end.astype(np.int64)
    durations = np.frombuffer(run.step_duration_s, dtype=np.float64)
    num_decode = np.frombuffer(run.step_num_decode, dtype=np.float64)
    num_emitted = np.frombuffer(run.step_num_emitted, dtype=np.float64)
    tokens = np.bincount(second_of, weights=num_emitted, minlength=seconds)[:seconds]
    itl: list[float] = []
    order = np.argsort(second_of, kind="stable")
    bounds = np.searchsorted(second_of[order], np.arange(seconds + 1))
    for s in range(seconds):
        chosen = order[bounds[s] : bounds[s + 1]]
        value = weighted_percentile(durations[chosen], num_decode[chosen], 0.95)
        itl.append(float("nan") if value is None else value * 1000.0)
    nan = float("nan")
    return {
        "t_s": [float(s) for s in range(seconds)],
        "ttft_p50_ms": [(_percentile(v, 0.5) or nan) * 1000.0 for v in ttft],
        "ttft_p95_ms": [(_percentile(v, 0.95) or nan) * 1000.0 for v in ttft],
        "itl_p95_ms": itl,
        "output_tokens_per_s": [float(x) for x in tokens],
        "sample_t_s": [t for t, _, _ in run.samples],
        "queue_depth": [float(q) for _, q, _ in run.samples],
        **_scaling_series(run),
    }


def _scaling_series(run: FleetRun) -> dict[str, list[float]]:
    if run.scaler is None:
        return {}
    samples = run.scaler.samples
    return {
        "scaling_t_s": [s.t_s for s in samples],
        "routed_replicas": [float(s.num_routed) for s in samples],
        "warm_pool_replicas": [float(s.num_warm) for s in samples],
        "starting_replicas": [float(s.num_starting) for s in samples],
    }


def write_json(path: Path, summary: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _plot_scaling(ax: Any, series: dict[str, list[float]], label: str, color: str) -> None:
    t_s = series["scaling_t_s"]
    ax.step(t_s, series["routed_replicas"], where="post", color=color, label=f"{label} routed")
    ax.step(
        t_s, series["warm_pool_replicas"], where="post", color=color, linestyle="--", label=f"{label} warm"
    )
    ax.step(
        t_s, series["starting_replicas"], where="post", color=color, linestyle=":", label=f"{label} starting"
    )


def write_png(path: Path, title: str, runs: list[tuple[str, FleetRun, dict[str, Any]]]) -> None:
    """One figure for one or more labelled runs of a scenario, overlaid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scaled = any(run.scaler is not None for _, run, _ in runs)
    fig, axes = plt.subplots(2, 3 if scaled else 2, figsize=(19 if scaled else 13, 8))
    (ax_ttft, ax_itl, *ax_scale), (ax_tput, ax_tenant, *ax_spare) = axes
    width = 0.8 / max(1, len(runs))
    ax_q = ax_tput.twinx()
    for k, (label, run, summary) in enumerate(runs):
        series = time_series(run)
        t = series["t_s"]
        color = f"C{k}"  # one colour per run in every panel
        ax_ttft.plot(t, series["ttft_p95_ms"], color=color, label=f"{label} p95")
        ax_ttft.plot(t, series["ttft_p50_ms"], color=color, linestyle=":", label=f"{label} p50")
        ax_itl.plot(t, series["itl_p95_ms"], color=color, label=label)
        ax_tput.plot(t, series["output_tokens_per_s"], color=color, label=f"{label} tokens/s")
        ax_q.plot(
            series["sample_t_s"], series["queue_depth"], color=color, linestyle="--", label=f"{label} queue"
        )
        tenants = summary["tenant_ttft_p95_ms"]
        names = list(tenants)
        xs = [i + k * width for i in range(len(names))]
        ax_tenant.bar(xs, [tenants[n] or 0.0 for n in names], width=width, color=color, label=label)
        ax_tenant.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=45)
        if ax_scale and "scaling_t_s" in series:
            _plot_scaling(ax_scale[0], series, label, color)
    ax_ttft.set(title="TTFT by arrival second (ms)", xlabel="s", yscale="log")
    ax_itl.set(title="inter-token latency p95 (ms)", xlabel="s")
    ax_itl.axhline(40.0, color="grey", linewidth=0.8)
    ax_tput.set(title="output tokens/s (solid), queue depth (dashed)", xlabel="s")
    ax_q.set_ylabel("queue depth")
    ax_tenant.set(title="TTFT p95 per tenant (ms)")
    for ax in ax_spare:
        ax.set_visible(False)
    for ax in ax_scale:
        ax.set(title="replicas: routed (solid), warm pool (dashed), starting (dotted)", xlabel="s")
    for ax in (ax_ttft, ax_itl, ax_tput, ax_tenant, *ax_scale):
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
