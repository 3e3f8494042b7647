"""The four scenarios of issue 4: steady (and the replica search), doubling, noisy-tenant, batch-fill.

doubling (issue 12) runs three fleets on the same arrivals: ``fixed`` (no autoscaler), ``cold-only`` (the
autoscaler, no warm pool: every added replica is a cold start) and ``warm-pool`` (the autoscaler with a
warm pool, the judged run). The autoscaler is the control plane's policy (sluice.policy.autoscale).

Tenants: 10 of equal weight share the interactive load; each has a token budget and a concurrency cap of
3x its share of the steady load (so its own quota never binds at the seed's load, and a doubling is met by
the queue's admission first). The noisy tenant and the batch tenants have no quota (see each scenario).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from control_plane.sim.autoscaling import SimAutoscale
from control_plane.sim.calibration import Calibration, seed_calibration
from control_plane.sim.fleet import Fleet, FleetConfig, FleetRun
from control_plane.sim.progress import ProgressSink, Tick
from control_plane.sim.report import summarize, write_json, write_png
from control_plane.sim.targets import (
    ITL_P95_TARGET_MS,
    TTFT_P95_TARGET_MS,
    judge,
    meets_targets,
    verdict_json,
)
from control_plane.sim.workload import (
    SEED_OUTPUT_TOKENS,
    SEED_PROMPT_TOKENS,
    SEED_RATE_PER_S,
    SimRequest,
    Stream,
    interactive_deadline_s,
)
from sluice.domain import RequestClass, Tenant
from sluice.policy.autoscale import AutoscaleConfig

SCENARIOS = ("steady", "doubling", "noisy-tenant", "batch-fill")
DOUBLING_RUNS = ("fixed", "cold-only", "warm-pool")
QUOTA_HEADROOM = 3.0
NOISY_TENANT = "noisy"


@dataclass(frozen=True)
class Options:
    replicas: int | None = None
    find_replicas: bool = False
    duration_s: float = 120.0
    seed: int = 0
    rate_per_s: float = SEED_RATE_PER_S  # the interactive load; tests scale it down
    num_noisy_requests: int = 10_000
    num_tenants: int = 10
    # doubling's autoscaler: a cold start's duration, the warm pool (None: as many replicas as the fleet,
    # enough to absorb a doubling), how often it decides, how long a promotion takes to be routed.
    cold_start_s: float = 120.0
    warm_pool_replicas: int | None = None
    autoscale_interval_s: float = 10.0
    promote_s: float = 5.0
    # Told of every fleet run's samples (``sluice sim`` prints progress lines); not part of the result.
    progress: ProgressSink | None = field(default=None, compare=False, repr=False)

    @property
    def warmup_s(self) -> float:
        return min(20.0, self.duration_s / 6)


Runs = list[tuple[str, FleetRun, dict[str, Any]]]


def tenants_for(options: Options, itl_target_s: float = 0.040) -> dict[str, Tenant]:
    share_per_s = options.rate_per_s / options.num_tenants
    tokens = SEED_PROMPT_TOKENS + SEED_OUTPUT_TOKENS
    in_flight = share_per_s * interactive_deadline_s(SEED_OUTPUT_TOKENS, itl_target_s)
    return {
        f"t{i}": Tenant(
            tenant_id=f"t{i}",
            name=f"tenant {i}",
            tokens_per_minute=math.ceil(QUOTA_HEADROOM * share_per_s * tokens * 60),
            max_concurrent_requests=math.ceil(QUOTA_HEADROOM * in_flight),
        )
        for i in range(options.num_tenants)
    }


def interactive_stream(options: Options, tenants: dict[str, Tenant], **kwargs: Any) -> Stream:
    ids = tuple(t for t in tenants if t.startswith("t"))
    return Stream("interactive", ids, RequestClass.INTERACTIVE, options.rate_per_s, **kwargs)


def run_fleet(
    options: Options,
    replicas: int,
    tenants: dict[str, Tenant],
    streams: list[Stream],
    label: str = "",
    **config: Any,
) -> FleetRun:
    """One fleet run; ``label`` names it in progress lines when a scenario runs several."""
    fleet_config = FleetConfig(
        num_replicas=replicas,
        duration_s=options.duration_s,
        warmup_s=options.warmup_s,
        seed=options.seed,
        **config,
    )
    sink = options.progress

    def on_sample(tick: Tick) -> None:
        if sink is not None:
            sink(label, tick)

    return Fleet(fleet_config, seed_calibration(), tenants, streams, on_sample).run()


def lower_bound_replicas(options: Options, cal: Calibration) -> int:
    """Output tokens/s needed / a replica's roofline peak at the ITL target (its prefill included)."""
    peak = cal.peak_output_tokens_per_s(SEED_PROMPT_TOKENS, SEED_OUTPUT_TOKENS, ITL_P95_TARGET_MS / 1000)
    return max(1, math.ceil(options.rate_per_s * SEED_OUTPUT_TOKENS / peak))


def find_replicas(options: Options) -> tuple[int, list[dict[str, Any]]]:
    """The fewest replicas meeting the targets on the steady load: from the roofline lower bound up in
    steps of 4, then back down one at a time to the first that passes."""
    tenants = tenants_for(options)
    tried: dict[int, dict[str, Any]] = {}

    def passes(n: int) -> bool:
        run = run_fleet(options, n, tenants, [interactive_stream(options, tenants)], f"search {n} replicas")
        summary = summarize(run)
        tried[n] = {k: summary[k] for k in ("ttft_p95_ms", "itl_p95_ms", "shed_rate", "utilisation")}
        return meets_targets(summary)

    n = lower_bound_replicas(options, seed_calibration())
    while not passes(n):
        n += 4
    found = n
    for m in range(max(lower_bound_replicas(options, seed_calibration()), n - 3), n):
        if m not in tried and passes(m):
            found = m
            break
    return found, [{"replicas": k, **v} for k, v in sorted(tried.items())]


def _fleet_size(options: Options, summary: dict[str, Any]) -> int:
    if options.replicas is not None:
        return options.replicas
    found, tried = find_replicas(options)
    summary["replica_search"] = {"found": found, "tried": tried}
    return found


def steady(options: Options) -> tuple[dict[str, Any], Runs]:
    summary: dict[str, Any] = {"scenario": "steady"}
    summary["lower_bound_replicas"] = lower_bound_replicas(options, seed_calibration())
    replicas = options.replicas
    if options.find_replicas or replicas is None:
        found, tried = find_replicas(options)
        summary["replica_search"] = {"found": found, "tried": tried}
        replicas = found if replicas is None else replicas
    tenants = tenants_for(options)
    run = run_fleet(options, replicas, tenants, [interactive_stream(options, tenants)])
    result = summarize(run)
    summary.update(result, meets_targets=meets_targets(result))
    return summary, [("steady", run, result)]


def reaction_s(options: Options) -> float:
    """How long the autoscaler may take to answer a doubling: the window that shows it, the next decision,
    a promotion. TTFT "after the doubling" is judged from the doubling plus this."""
    return 2 * options.autoscale_interval_s + options.promote_s


def _autoscale(options: Options, replicas: int, warm_pool_replicas: int) -> SimAutoscale:
    policy = AutoscaleConfig(
        min_replicas=1,
        max_replicas=3 * replicas,
        warm_pool_replicas=warm_pool_replicas,
        ttft_slo_s=TTFT_P95_TARGET_MS / 1000,
        scale_up_stabilization_s=2 * options.autoscale_interval_s,
    )
    return SimAutoscale(policy, options.autoscale_interval_s, options.cold_start_s, options.promote_s)


def doubling(options: Options) -> tuple[dict[str, Any], Runs]:
    """The steady load, doubled at t = duration/3 and held, on three fleets (module docstring)."""
    summary: dict[str, Any] = {"scenario": "doubling"}
    replicas = _fleet_size(options, summary)
    tenants = tenants_for(options)
    at_s = options.duration_s / 3
    stream = interactive_stream(options, tenants, rate_steps=((at_s, 2.0),))
    warm = replicas if options.warm_pool_replicas is None else options.warm_pool_replicas
    from_s = at_s + reaction_s(options)
    variants = [("fixed", None), ("cold-only", 0), ("warm-pool", warm)]
    runs: Runs = []
    for label, pool in variants:
        autoscale = None if pool is None else _autoscale(options, replicas, pool)
        run = run_fleet(options, replicas, tenants, [stream], label, autoscale=autoscale)
        result = summarize(run)
        result["interactive_served_past_deadline"] = result["served_past_deadline"].get("interactive", 0)
        result["ttft_p95_ms_after_doubling"] = _ttft_p95_ms(run.requests, from_s, options.duration_s)
        runs.append((label, run, result))
        summary[label] = result
    summary.update(
        replicas=replicas,
        doubling_at_s=at_s,
        ttft_judged_from_s=from_s,
        warm_pool_replicas=warm,
        cold_start_s=options.cold_start_s,
    )
    return summary, runs


def _ttft_p95_ms(
    requests: list[SimRequest], from_s: float, to_s: float, but_tenant: str | None = None
) -> float | None:
    """Interactive TTFT p95 over arrivals in [from_s, to_s) (``but_tenant``'s left out)."""
    ttfts = sorted(
        r.first_token_s - r.arrival_s
        for r in requests
        if r.tenant_id != but_tenant
        and r.request_class is RequestClass.INTERACTIVE
        and from_s <= r.arrival_s < to_s
        and r.first_token_s is not None
    )
    if not ttfts:
        return None
    return round(ttfts[min(len(ttfts) - 1, math.ceil(0.95 * len(ttfts)) - 1)] * 1000.0, 2)


def _others_ttft_p95_ms(requests: list[SimRequest], from_s: float, to_s: float) -> float | None:
    return _ttft_p95_ms(requests, from_s, to_s, but_tenant=NOISY_TENANT)


def noisy_tenant(options: Options) -> tuple[dict[str, Any], Runs]:
    """The steady load plus one tenant sending ``num_noisy_requests`` generations of 1 000 prompt / 1 000
    output tokens within ~4 s from t = duration/3. Its token budget covers all of them twice over and it
    has no concurrency cap, so quotas refuse none of them: the queue alone (admission, WFQ) decides."""
    summary: dict[str, Any] = {"scenario": "noisy-tenant"}
    replicas = _fleet_size(options, summary)
    tenants = tenants_for(options)
    noisy_tokens = options.num_noisy_requests * 2 * 1_000
    with_noisy = {**tenants, NOISY_TENANT: Tenant(NOISY_TENANT, "noisy", tokens_per_minute=2 * noisy_tokens)}
    at_s = options.duration_s / 3
    burst = Stream(
        "noisy",
        (NOISY_TENANT,),
        RequestClass.INTERACTIVE,
        rate_per_s=options.num_noisy_requests / 4.0,
        start_s=at_s,
        end_s=at_s + 8.0,
        prompt_tokens=1_000,
        output_tokens=1_000,
        max_requests=options.num_noisy_requests,
        burst_sigma=0.0,
    )
    runs: Runs = []
    variants = [
        ("wfq-baseline", tenants, False, True),
        ("wfq-noisy", with_noisy, True, True),
        ("fcfs-noisy", with_noisy, True, False),
    ]
    others: dict[str, float | None] = {}
    for label, tenant_set, noisy, fair in variants:
        streams = [interactive_stream(options, tenants)] + ([burst] if noisy else [])
        run = run_fleet(options, replicas, tenant_set, streams, label, fair=fair)
        result = summarize(run)
        others[label] = _others_ttft_p95_ms(run.requests, at_s, options.duration_s)
        result["others_ttft_p95_ms_from_burst"] = others[label]
        result["noisy_outcomes"] = _outcomes(run.requests, NOISY_TENANT)
        runs.append((label, run, result))
        summary[label] = result
    base = others["wfq-baseline"]

    def rise(label: str) -> float | None:
        value = others[label]
        return None if base is None or value is None else round(value / base - 1.0, 4)

    summary.update(
        replicas=replicas,
        noisy_burst_at_s=at_s,
        others_ttft_p95_ms=others,
        others_ttft_p95_rise={"wfq": rise("wfq-noisy"), "fcfs": rise("fcfs-noisy")},
    )
    return summary, runs


def _outcomes(requests: list[SimRequest], tenant_id: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in requests:
        if r.tenant_id == tenant_id and r.outcome is not None:
            key = r.outcome.value + (f":{r.reason}" if r.reason else "")
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def batch_fill(options: Options) -> tuple[dict[str, Any], Runs]:
    """Interactive load at 55 % of the fleet's roofline peak, plus batch requests (no quota) arriving at
    60 % of it: more than the spare capacity, so a standing batch backlog forms (bounded by the queue's
    admission at its 600 s deadline). Arrivals stop at the end; what is still queued is left open."""
    summary: dict[str, Any] = {"scenario": "batch-fill"}
    replicas = _fleet_size(options, summary)
    cal = seed_calibration()
    peak = cal.peak_output_tokens_per_s(SEED_PROMPT_TOKENS, SEED_OUTPUT_TOKENS, ITL_P95_TARGET_MS / 1000)
    fleet_rate = replicas * peak / SEED_OUTPUT_TOKENS  # requests/s at the roofline peak
    interactive = Options(**{**options.__dict__, "rate_per_s": 0.55 * fleet_rate})
    tenants = tenants_for(interactive)
    batch_ids = ("batch-a", "batch-b")
    all_tenants = {**tenants, **{b: Tenant(b, b) for b in batch_ids}}
    streams = [
        interactive_stream(interactive, tenants),
        Stream("batch", batch_ids, RequestClass.BATCH, 0.60 * fleet_rate),
    ]
    run = run_fleet(interactive, replicas, all_tenants, streams, drain_s=0.0)
    result = summarize(run)
    summary.update(
        result,
        interactive_rate_per_s=round(interactive.rate_per_s, 2),
        batch_rate_per_s=round(0.60 * fleet_rate, 2),
    )
    return summary, [("batch-fill", run, result)]


def run_scenario(name: str, options: Options, out_dir: Path) -> dict[str, Any]:
    """Run scenario ``name``, judge it against its targets (``summary["targets"]``, see targets.py) and
    write ``<out_dir>/<name>.json`` and ``.png``; returns the summary written."""
    functions = {"steady": steady, "doubling": doubling, "noisy-tenant": noisy_tenant}
    functions["batch-fill"] = batch_fill
    summary, runs = functions[name](options)
    summary["targets"] = verdict_json(judge(name, summary))
    write_json(out_dir / f"{name}.json", summary)
    write_png(out_dir / f"{name}.png", f"sluice sim: {name} ({summary.get('replicas')} replicas)", runs)
    return summary
