"""The placement benchmark's pure parts (bench/placement_bench.py): its workload of shared system prompts,
the prefix-cache hit rate over telemetry records, and the summary table."""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkItem:
    tenant_id: str
    prompt_index: int  # which of the tenant's system prompts
    suffix: tuple[int, ...]  # the user's part after it


@dataclass(frozen=True)
class Workload:
    system_prompts: dict[tuple[str, int], list[int]]  # (tenant, prompt index) -> token ids
    items: list[WorkItem]

    def prompt(self, item: WorkItem) -> list[int]:
        return self.system_prompts[(item.tenant_id, item.prompt_index)] + list(item.suffix)


def tenant_ids(num_tenants: int) -> list[str]:
    return [f"bench-t{i}" for i in range(num_tenants)]


def make_workload(
    pool: Sequence[int],
    num_tenants: int,
    num_prompts: int,
    num_system_tokens: int,
    num_suffix_tokens: int,
    num_requests: int,
    prompts_seed: int,
    items_seed: int,
) -> Workload:
    """System prompts drawn from ``pool`` by ``prompts_seed``; the requests (which tenant and prompt, and
    the suffix) by ``items_seed``, so two runs can ask in the same order for different prompts."""
    if min(num_tenants, num_prompts, num_system_tokens, num_requests) < 1 or num_suffix_tokens < 0:
        raise ValueError("tenants, prompts, system tokens and requests must be >= 1, suffix tokens >= 0")
    draw = random.Random(prompts_seed)
    tenants = tenant_ids(num_tenants)
    system = {(t, i): draw.choices(pool, k=num_system_tokens) for t in tenants for i in range(num_prompts)}
    order = random.Random(items_seed)
    items = [
        WorkItem(
            order.choice(tenants),
            order.randrange(num_prompts),
            tuple(order.choices(pool, k=num_suffix_tokens)),
        )
        for _ in range(num_requests)
    ]
    return Workload(system, items)


def hit_rate(records: Iterable[dict[str, Any]]) -> float:
    """Prompt tokens served from the replicas' prefix caches / prompt tokens, over finished requests.
    Raises ValueError when a finished request has no ``cached_tokens`` (the replica did not report it: a
    rate without it would be made up) or when there is no prompt token at all."""
    num_cached = num_prompt = 0
    for record in records:
        if record["outcome"] != "finished":
            continue
        if record.get("cached_tokens") is None:
            raise ValueError(f"request {record['request_id']} has no cached_tokens in its telemetry")
        num_cached += record["cached_tokens"]
        num_prompt += record["prompt_tokens"]
    if num_prompt == 0:
        raise ValueError("no finished request with prompt tokens")
    return num_cached / num_prompt


def median_range(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """``median [min-max]`` of ``values`` (one per round), e.g. ``12.0 [11.0-13.5]``."""
    if not values:
        return "n/a"
    median = statistics.median(values)
    return f"{fmt.format(median)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


@dataclass(frozen=True)
class RunResult:
    placement: str
    round_index: int
    hit_rate: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    tokens_per_s: float
    num_requests: int
    num_by_replica: dict[str, int]  # requests each replica served


def summary_table(results: Sequence[RunResult], placements: Sequence[str]) -> list[str]:
    """One markdown row per placement: each figure the median over its rounds with their range."""
    lines = [
        "| placement | prefix-cache hit rate (%) | TTFT p50 (ms) | TTFT p95 (ms) | tok/s "
        "| requests per replica |",
        "|---|---|---|---|---|---|",
    ]
    for placement in placements:
        runs = [r for r in results if r.placement == placement]
        spread = " / ".join(
            ",".join(str(n) for _, n in sorted(r.num_by_replica.items())) for r in runs
        )  # fmt: skip
        lines.append(
            f"| {placement} | {median_range([100 * r.hit_rate for r in runs])} "
            f"| {median_range([r.ttft_p50_ms for r in runs], '{:.0f}')} "
            f"| {median_range([r.ttft_p95_ms for r in runs], '{:.0f}')} "
            f"| {median_range([r.tokens_per_s for r in runs], '{:.0f}')} | {spread} |"
        )
    return lines


def max_hit_rate(num_system_tokens: int, num_suffix_tokens: int, block_size_tokens: int = 16) -> float:
    """The most a request can hit: the system prompt's full KV blocks (the cache holds full blocks only;
    the suffix is new every time) over its prompt."""
    return (num_system_tokens // block_size_tokens * block_size_tokens) / (
        num_system_tokens + num_suffix_tokens
    )


def comparison(results: Sequence[RunResult], baselines: Sequence[str]) -> str:
    """One sentence: the ``score`` placement's medians against each baseline's (hit rate in points, TTFT
    and tok/s in per cent); "" when ``score`` or every baseline is missing."""
    fields = ("hit_rate", "ttft_p50_ms", "ttft_p95_ms", "tokens_per_s")
    medians = {
        placement: {f: statistics.median(getattr(r, f) for r in runs) for f in fields}
        for placement in {r.placement for r in results}
        if (runs := [r for r in results if r.placement == placement])
    }
    ours = medians.get("score")
    parts = []
    for baseline in baselines:
        theirs = medians.get(baseline)
        if ours is None or theirs is None or baseline == "score":
            continue
        changes = [f"hit rate {100 * (ours['hit_rate'] - theirs['hit_rate']):+.1f} points"]
        for field, label in (
            ("ttft_p50_ms", "TTFT p50"),
            ("ttft_p95_ms", "TTFT p95"),
            ("tokens_per_s", "tok/s"),
        ):
            changes.append(f"{label} {100 * (ours[field] / theirs[field] - 1):+.0f}%")
        parts.append(f"against {baseline}: {', '.join(changes)}")
    return f"Score (medians) {'; '.join(parts)}." if parts else ""
