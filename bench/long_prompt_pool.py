"""A long-prompt pool against one general pool (issue 12): short prompts' TTFT under a mixed load, through
a gateway routing by the registry over two local tritonservers, in two layouts of the same replicas:

- ``one-pool``: both replicas general; every prompt may land on either;
- ``split``: r1 general, r2 long-prompt, and the gateway's ``SLUICE_LONG_PROMPT_MIN_TOKENS`` set, so
  long prompts queue for r2 only and short ones for r1 only.

Workload (open loop, the same arrival times for both layouts within a round): short prompts of
``--short-tokens`` at ``--short-rate`` a second and long prompts of ``--long-tokens`` (near the
gateway's 1,536-token prompt limit) at ``--long-rate`` a second, Poisson arrivals over ``--duration-s``,
``--output-tokens`` out each (ignore_eos), random token ids drawn fresh every run (no prefix-cache hit
carries over). Runs alternate between the layouts, the order swapped each round; the table gives the
median over the rounds with its range. TTFT is the client's, from each request's send to its first token.

    .venv/bin/python -m bench.long_prompt_pool [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from bench.e2e_bench import plain_prompt_ids
from bench.placement_bench import Gateway, one_request, read_records, seed_state, start_replica
from bench.placement_workload import median_range, tenant_ids
from bench.report import cpu_description, cpu_flags, pct, write_measured
from bench.servers import log
from cpu_engine.devckpt import write_checkpoint
from replicas.launcher import TritonServer
from sluice.settings import Settings
from sluice.stores.registry.base import ReplicaPool
from sluice.stores.registry.sqlite import SqliteRegistry

SECTION = "long-prompt-pool"
LAYOUTS = ("one-pool", "split")
LONG_REPLICA = "r2"  # the long-prompt pool in the split layout
SHORT, LONG = "short", "long"


# ----- the workload (pure) -----
@dataclass(frozen=True)
class Arrival:
    at_s: float  # from the run's start
    kind: str  # SHORT or LONG


def poisson_times(rate_per_s: float, duration_s: float, rng: np.random.Generator) -> list[float]:
    """Arrival times of a Poisson process of ``rate_per_s`` in [0, ``duration_s``)."""
    times, now_s = [], 0.0
    while rate_per_s > 0:
        now_s += float(rng.exponential(1 / rate_per_s))
        if now_s >= duration_s:
            break
        times.append(now_s)
    return times


def schedule(short_rate: float, long_rate: float, duration_s: float, seed: int) -> list[Arrival]:
    """Both streams' arrivals, by time: the same for every layout given the same ``seed``."""
    rng = np.random.default_rng(seed)
    shorts = [Arrival(t, SHORT) for t in poisson_times(short_rate, duration_s, rng)]
    longs = [Arrival(t, LONG) for t in poisson_times(long_rate, duration_s, rng)]
    return sorted(shorts + longs, key=lambda a: a.at_s)


# ----- a run's figures (pure) -----
@dataclass(frozen=True)
class RunResult:
    layout: str
    round_index: int
    short_ttfts_ms: tuple[float, ...]
    long_ttfts_ms: tuple[float, ...]
    num_failed: int  # requests refused or failed (no TTFT)
    num_by_replica: dict[str, int]  # "r1 short" -> requests, from the telemetry

    def ttft_ms(self, kind: str, q: float) -> float:
        return pct(list(self.short_ttfts_ms if kind == SHORT else self.long_ttfts_ms), q)


def summary_table(results: Sequence[RunResult]) -> list[str]:
    """One markdown row per layout: each figure the median over its rounds [min-max]."""
    lines = [
        "| layout | short TTFT p50 (ms) | short TTFT p95 (ms) | long TTFT p50 (ms) | long TTFT p95 (ms) "
        "| failed | requests per replica (round 1) |",
        "|---|---|---|---|---|---|---|",
    ]
    for layout in LAYOUTS:
        runs = [r for r in results if r.layout == layout]
        if not runs:
            continue
        cells = [median_range([r.ttft_ms(kind, q) for r in runs], "{:.0f}") for kind in (SHORT, LONG)
                 for q in (50, 95)]  # fmt: skip
        spread = ", ".join(f"{name} {n}" for name, n in sorted(runs[0].num_by_replica.items()))
        lines.append(f"| {layout} | {' | '.join(cells)} | {sum(r.num_failed for r in runs)} | {spread} |")
    return lines


def comparison(results: Sequence[RunResult]) -> str:
    """One sentence: the split layout's medians against one pool's (in per cent); "" without both."""
    medians: dict[str, dict[tuple[str, int], float]] = {}
    for layout in LAYOUTS:
        runs = [r for r in results if r.layout == layout]
        if runs:
            medians[layout] = {
                (kind, q): statistics.median(r.ttft_ms(kind, q) for r in runs)
                for kind in (SHORT, LONG) for q in (50, 95)
            }  # fmt: skip
    if len(medians) < len(LAYOUTS):
        return ""
    split, one = medians["split"], medians["one-pool"]
    changes = ", ".join(
        f"{kind} TTFT p{q} {100 * (split[kind, q] / one[kind, q] - 1):+.0f}%"
        for kind in (SHORT, LONG) for q in (50, 95)
    )  # fmt: skip
    return f"Split against one pool (medians): {changes}."


# ----- the servers -----
class PoolGateway(Gateway):
    """placement_bench's gateway (score placement) over one layout's registry; the split layout's has
    the long-prompt threshold."""

    def __init__(self, state_dir: Path, checkpoint: Path, layout: str, log_dir: Path, threshold: int | None):
        super().__init__(state_dir, checkpoint, "score", log_dir)
        self.placement = layout  # names it in its errors
        self.log_path = log_dir / f"gateway-{layout}.log"
        if threshold is not None:
            self._env["SLUICE_LONG_PROMPT_MIN_TOKENS"] = str(threshold)


async def seed_layout(
    settings: Settings, servers: dict[str, TritonServer], checkpoint: Path, layout: str
) -> None:
    """placement_bench's registry and tenants; in the split layout, ``LONG_REPLICA`` long-prompt."""
    await seed_state(settings, servers, checkpoint, tenant_ids(4))
    if layout == "split":
        registry = SqliteRegistry(settings.sqlite_path)
        await registry.open()
        try:
            await registry.set_replica_pool(LONG_REPLICA, ReplicaPool.LONG_PROMPT, actor="long-prompt-bench")
        finally:
            await registry.close()


@dataclass(frozen=True)
class Fleet:
    gateways: dict[str, PoolGateway]  # layout -> its gateway
    names: dict[str, str]  # replica endpoint (as the telemetry names it) -> replica id
    checkpoint: Path


@contextlib.contextmanager
def running_layouts(root: Path, args: argparse.Namespace) -> Iterator[Fleet]:
    """Two replicas, and one gateway per layout over them (each with its own state directory)."""
    checkpoint = write_checkpoint(root / "checkpoint", seed=0)
    servers: dict[str, TritonServer] = {}
    gateways: dict[str, PoolGateway] = {}
    try:
        for replica_id in ("r1", "r2"):  # NOTE: from this thread: a server dies with its starting thread
            servers[replica_id] = start_replica(root, checkpoint, replica_id, args.kv_blocks)
        for layout in LAYOUTS:
            state_dir = root / f"state-{layout}"
            state_dir.mkdir()
            settings = Settings(state_dir=state_dir, checkpoint_dir=checkpoint)
            asyncio.run(seed_layout(settings, servers, checkpoint, layout))
            threshold = args.threshold_tokens if layout == "split" else None
            gateways[layout] = PoolGateway(state_dir, checkpoint, layout, root, threshold)
            gateways[layout].start()
        for gateway in gateways.values():
            gateway.wait_routing(len(servers))
        log(f"replicas and gateways ready: {', '.join(f'{n} {g.base_url}' for n, g in gateways.items())}")
        yield Fleet(gateways, {s.grpc_url: replica_id for replica_id, s in servers.items()}, checkpoint)
    finally:
        for gateway in gateways.values():
            gateway.stop()
        for server in servers.values():
            server.stop()


# ----- a run -----
async def drive(
    base_url: str, arrivals: Sequence[Arrival], prompts: Sequence[list[int]], max_tokens: int
) -> list[tuple[str, str | None, float | None]]:
    """Each arrival sent at its time; (kind, request id, TTFT ms) per request, None for a failed one."""
    tenants = tenant_ids(4)
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as client:
        began_s = time.perf_counter()

        async def send(index: int, arrival: Arrival) -> tuple[str, str | None, float | None]:
            await asyncio.sleep(max(0.0, began_s + arrival.at_s - time.perf_counter()))
            try:
                sent = await one_request(client, tenants[index % len(tenants)], prompts[index], max_tokens)
            except (RuntimeError, httpx.HTTPError) as exc:
                log(f"{arrival.kind} request failed: {exc}")
                return arrival.kind, None, None
            return arrival.kind, sent.request_id, sent.ttft_ms

        return await asyncio.gather(*(send(i, a) for i, a in enumerate(arrivals)))


def measure(
    fleet: Fleet, layout: str, arrivals: Sequence[Arrival], prompts: Sequence[list[int]], max_tokens: int,
    round_index: int,
) -> RunResult:  # fmt: skip
    gateway = fleet.gateways[layout]
    sent = asyncio.run(drive(gateway.base_url, arrivals, prompts, max_tokens))
    kind_of = {request_id: kind for kind, request_id, _ in sent if request_id is not None}
    records = read_records(gateway.telemetry_path, set(kind_of))
    result = RunResult(
        layout=layout,
        round_index=round_index,
        short_ttfts_ms=tuple(t for kind, _, t in sent if kind == SHORT and t is not None),
        long_ttfts_ms=tuple(t for kind, _, t in sent if kind == LONG and t is not None),
        num_failed=sum(1 for _, request_id, _ in sent if request_id is None),
        num_by_replica=dict(
            Counter(f"{fleet.names[r['replica']]} {kind_of[r['request_id']]}" for r in records)
        ),
    )
    log(
        f"round {round_index} {layout}: short TTFT p50 {result.ttft_ms(SHORT, 50):.0f} p95 "
        f"{result.ttft_ms(SHORT, 95):.0f} ms, long p50 {result.ttft_ms(LONG, 50):.0f} p95 "
        f"{result.ttft_ms(LONG, 95):.0f} ms, {result.num_failed} failed, {result.num_by_replica}"
    )
    return result


# ----- the benchmark -----
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration-s", type=float, default=20.0, help="of each run's arrivals")
    ap.add_argument("--short-rate", type=float, default=6.0, help="short prompts a second")
    ap.add_argument("--long-rate", type=float, default=0.4, help="long prompts a second")
    ap.add_argument("--short-tokens", type=int, default=64)
    ap.add_argument("--long-tokens", type=int, default=1500)
    ap.add_argument(
        "--threshold-tokens", type=int, default=1024, help="the split layout's long-prompt threshold"
    )
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--kv-blocks", type=int, default=512, help="per replica, 16 tokens each")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--write-docs", action="store_true", help=f"write section {SECTION!r} of docs/benchmarks.md"
    )
    args = ap.parse_args(argv)
    if min(args.rounds, args.short_tokens, args.output_tokens, args.kv_blocks) < 1 or args.duration_s <= 0:
        ap.error("rounds, duration, token counts and kv-blocks must be positive")
    if not args.short_tokens < args.threshold_tokens <= args.long_tokens:
        ap.error("short prompts must be under --threshold-tokens and long ones at or above it")
    if min(args.short_rate, args.long_rate) <= 0:
        ap.error("rates must be positive")
    return args


def run_rounds(args: argparse.Namespace, fleet: Fleet) -> list[RunResult]:
    """Each layout once a round, the order swapped each round; both get the round's arrivals, each its
    own fresh prompts of the same lengths."""
    vocab = np.asarray(plain_prompt_ids(fleet.checkpoint))
    results = []
    for round_index in range(args.rounds):
        arrivals = schedule(
            args.short_rate, args.long_rate, args.duration_s, seed=args.seed * 1_000 + round_index
        )
        order = LAYOUTS if round_index % 2 == 0 else LAYOUTS[::-1]
        for layout in order:
            rng = np.random.default_rng([args.seed, round_index, LAYOUTS.index(layout)])
            prompts = [
                rng.choice(vocab, args.short_tokens if a.kind == SHORT else args.long_tokens).tolist()
                for a in arrivals
            ]
            results.append(measure(fleet, layout, arrivals, prompts, args.output_tokens, round_index))
    return results


def report_lines(args: argparse.Namespace, results: list[RunResult]) -> list[str]:
    return [
        f"CPU: {cpu_description()} (flags: {cpu_flags()}); 2 tritonservers with the dev checkpoint, engine "
        f"on 1 thread each, {args.kv_blocks} KV blocks of 16 tokens per replica; one gateway per layout, "
        f"routing by the registry (score placement); split: r1 general, r2 long-prompt, "
        f"SLUICE_LONG_PROMPT_MIN_TOKENS={args.threshold_tokens}.",
        "",
        f"Workload (open loop, Poisson): short prompts of {args.short_tokens} tokens at "
        f"{args.short_rate:g}/s and long prompts of {args.long_tokens} tokens at {args.long_rate:g}/s for "
        f"{args.duration_s:g} s, "
        f"{args.output_tokens} tokens out each; the same arrival times for both layouts in a round, fresh "
        f"prompts every run; {args.rounds} rounds alternating the layouts. Median over the rounds "
        "[min-max]; TTFT at the client.",
        "",
        *summary_table(results),
        "",
        f"{comparison(results)} What the split trades: a short prompt no longer shares its replica's steps "
        "with a long prefill, but short prompts get one replica instead of two, and long prompts queue for "
        "one replica. The two replicas, the gateways and the client share the machine's cores.",
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m bench.long_prompt_pool " + " ".join(sys.argv[1:] if argv is None else argv)
    with (
        tempfile.TemporaryDirectory(prefix="sluice-long-prompt-") as tmp,
        running_layouts(Path(tmp), args) as fleet,
    ):
        results = run_rounds(args, fleet)
    lines = report_lines(args, results)
    print("\n".join(lines))
    if args.write_docs:
        write_measured(SECTION, command.strip(), lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
