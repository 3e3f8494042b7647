"""How long a registry change takes to reach the gateways that follow it (issue 11: "a change reaches
every gateway within a second").

Starts ``--followers`` registry followers (``gateway.routing.follower.RegistryFollower``, each on a
registry object of its own, as each gateway has; the router they feed is a stand-in that records the
tables, so no replica is needed), then makes ``--changes`` route writes through another registry object
(as the control plane does), one every ``--gap-ms``, and records for each write the time from its
commit to each follower routing by its generation. On PostgreSQL (a database created for the run on
the local server and dropped after it) followers hear NOTIFY; on SQLite (a file in a temporary folder)
they poll every 0.2 s. Prints p50 / p95 / max per backend.

    .venv/bin/python -m bench.registry_propagation [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, cast

import psycopg
from psycopg import sql

from bench.report import cpu_description, cpu_flags, pct, write_section
from gateway.metrics import GatewayMetrics
from gateway.routing.follower import RegistryFollower
from gateway.routing.table import RoutingTable
from sluice.stores.registry.base import Registry, VersionState
from sluice.stores.registry.postgres import PostgresRegistry
from sluice.stores.registry.sqlite import SqliteRegistry

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MODEL = "m"
ACTOR = "bench"


class _Recorder:
    """The router's stand-in: when each generation arrived."""

    def __init__(self) -> None:
        self.arrived_s: dict[int, float] = {}

    async def apply(self, table: RoutingTable) -> None:
        self.arrived_s.setdefault(table.generation, time.perf_counter())


async def _seed(registry: Registry) -> None:
    await registry.create_model(MODEL, actor=ACTOR)
    for version in ("1", "2"):
        digest = "sha256:" + version * 64
        await registry.add_version(
            MODEL,
            version,
            artifact_uri=f"file:///v{version}",
            weights_digest=digest,
            build_config={},
            actor=ACTOR,
        )
        await registry.set_version_state(MODEL, version, VersionState.WARMING, actor=ACTOR)
        await registry.set_version_state(MODEL, version, VersionState.SERVING, actor=ACTOR)
    await registry.set_route(MODEL, {"1": 10_000, "2": 0}, actor=ACTOR)


async def measure(
    make_registry: Callable[[], Registry], num_followers: int, num_changes: int, gap_s: float
) -> list[float]:
    """Milliseconds from each write's commit to each follower routing by it."""
    async with AsyncExitStack() as stack:
        writer = make_registry()
        await writer.open()
        stack.push_async_callback(writer.close)
        await _seed(writer)
        recorders = []
        for _ in range(num_followers):
            registry = make_registry()
            await registry.open()
            stack.push_async_callback(registry.close)
            recorder = _Recorder()
            follower = RegistryFollower(registry, cast(Any, recorder), GatewayMetrics(), poll_interval_s=5.0)
            await follower.start()
            stack.push_async_callback(follower.close)
            recorders.append(recorder)
        await asyncio.sleep(0.5)
        delays_ms: list[float] = []
        rng = random.Random(0)
        for i in range(num_changes):
            canary_bp = 1_000 * (1 + i % 9)
            await writer.set_route(MODEL, {"1": 10_000 - canary_bp, "2": canary_bp}, actor=ACTOR)
            committed_s = time.perf_counter()
            generation = await writer.generation()
            deadline = committed_s + 5.0
            while not all(generation in r.arrived_s for r in recorders) and time.perf_counter() < deadline:
                await asyncio.sleep(0.001)
            delays_ms += [
                (r.arrived_s[generation] - committed_s) * 1000 if generation in r.arrived_s else 5000.0
                for r in recorders
            ]
            await asyncio.sleep(rng.uniform(0.5, 1.5) * gap_s)  # random: no phase lock with a poll period
        return delays_ms


async def _postgres(run: Callable[[Callable[[], Registry]], Awaitable[list[float]]]) -> list[float]:
    name = f"sluice_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = f"{ADMIN_URL.rpartition('/')[0]}/{name}"
        return await run(lambda: PostgresRegistry(url, pool_max_size=2))
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


async def main_async(args: argparse.Namespace) -> dict[str, list[float]]:
    def run(make: Callable[[], Registry]) -> Awaitable[list[float]]:
        return measure(make, args.followers, args.changes, args.gap_ms / 1000)

    results = {"PostgreSQL (LISTEN/NOTIFY)": await _postgres(run)}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sluice.db"
        results["SQLite (polled every 0.2 s)"] = await run(lambda: SqliteRegistry(path))
    return results


def table(results: dict[str, list[float]], args: argparse.Namespace) -> str:
    rows = [
        "| backend | changes x followers | p50 ms | p95 ms | max ms | over 1 s |",
        "|---|---|---|---|---|---|",
    ]
    for backend, delays in results.items():
        over = sum(1 for d in delays if d > 1000)
        rows.append(
            f"| {backend} | {args.changes} x {args.followers} | {statistics.median(delays):.1f} | "
            f"{pct(delays, 95):.1f} | {max(delays):.1f} | {over} |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--followers", type=int, default=4, help="gateways following the registry")
    ap.add_argument("--changes", type=int, default=40)
    ap.add_argument("--gap-ms", type=float, default=100.0)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    results = asyncio.run(main_async(args))
    body = table(results, args)
    print(f"CPU: {cpu_description()}; flags: {cpu_flags()}\n\n{body}")
    if args.write_docs:
        command = ".venv/bin/python -m bench.registry_propagation --write-docs"
        write_section(
            "registry-propagation",
            "\n".join(
                [
                    "## A registry change reaching the gateways (issue 11)",
                    "",
                    f"Measured {time.strftime('%Y-%m-%d %H:%M')} with `{command}`: route writes through",
                    "one registry object at random gaps, each followed by gateways' registry followers on",
                    "registry objects of their own (from the write's commit to the follower routing by it).",
                    "",
                    f"CPU: {cpu_description()}; flags: {cpu_flags()}",
                    "",
                    body,
                ]
            ),
        )


if __name__ == "__main__":
    main()
