"""Cancel-to-free latency: from a client closing its stream to the replica letting go of the request.

Starts ``make run``'s stack (``python -m gateway.devstack``: gateway, control plane, tritonserver with the
CPU engine) on free ports, with a state directory and a model repository of its own: the repository is
rendered with the engine's stats exported every ``--stats-interval-ms`` (5 ms; ``make run``'s is 100 ms),
which bounds the resolution of every figure here. Then, one stream at a time (so the replica's counts
belong to that stream alone), ``--streams`` times: a streamed completion of up to ``--max-tokens`` tokens
(ignore_eos) for a tenant with safety policy none (text leaves token by token), read until ``--tokens``
text chunks came, then closed by the client; from that moment the replica's Triton metrics are polled until
its active request count (``nv_trt_llm_request_metrics{request_type="active"}``) and its used KV blocks
(``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used"}``) are back to what they were before
the stream. That time is the request's cancel-to-free latency: the gateway noticing the closed connection,
cancelling its gRPC stream, Triton marking the request cancelled, the model's cancel sweep aborting it in
the engine (``cancellation_check_period_ms``), and the next stats export.

    .venv/bin/python -m bench.cancel_bench [--streams 50] [--tokens 8] [--write-docs]

Reported: median / p95 / max over the streams, a table row, and with ``--write-docs`` a histogram
(docs/img/cancel-to-free.png), its raw numbers beside it (.json) and the section ``cancel-to-free`` of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import plots
from bench.report import cpu_description, load_average, pct, write_measured
from bench.servers import REPO_ROOT, SluiceStack, StackPorts, log
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice.stores.tenants.base import dev_tenant

SECTION = "cancel-to-free"
WORK_DIR = REPO_ROOT / ".sluice" / "bench" / "cancel"
PLOT = REPO_ROOT / "docs" / "img" / "cancel-to-free.png"
TENANT_ID, API_KEY = "bench-cancel", "sk-bench-cancel"
_GAUGE = re.compile(r"^(nv_trt_llm_\w+)\{([^}]*)\}\s+(\S+)", re.M)


@dataclass(frozen=True)
class ReplicaState:
    """What the replica holds: requests in the engine (running + waiting) and KV blocks referenced."""

    num_active: int
    num_kv_blocks_used: int

    def holds_more_than(self, other: ReplicaState) -> bool:
        return self.num_active > other.num_active or self.num_kv_blocks_used > other.num_kv_blocks_used


def parse_replica_state(metrics_text: str) -> ReplicaState:
    """The engine's gauges from a Triton /metrics page; ValueError if it exports none (not loaded yet)."""
    values: dict[tuple[str, str], float] = {}
    for family, labels, value in _GAUGE.findall(metrics_text):
        for label in ("request_type", "kv_cache_block_type"):
            if kind := re.search(rf'{label}="(\w+)"', labels):
                values[(family, kind.group(1))] = float(value)
    try:
        return ReplicaState(
            num_active=int(values[("nv_trt_llm_request_metrics", "active")]),
            num_kv_blocks_used=int(values[("nv_trt_llm_kv_cache_block_metrics", "used")]),
        )
    except KeyError:
        raise ValueError("the replica exports no engine gauges (is its model loaded?)") from None


@dataclass(frozen=True)
class CancelSample:
    """One stream's figures, ms from the client closing it; None where that did not happen in time."""

    requests_freed_ms: float | None  # the active request count back to its value before the stream
    kv_freed_ms: float | None  # the used KV blocks back
    num_chunks_read: int

    @property
    def freed_ms(self) -> float | None:
        """Both let go: the request's cancel-to-free latency."""
        if self.requests_freed_ms is None or self.kv_freed_ms is None:
            return None
        return max(self.requests_freed_ms, self.kv_freed_ms)


async def wait_freed(
    close: Callable[[], Awaitable[None]],
    read_state: Callable[[], Awaitable[ReplicaState]],
    baseline: ReplicaState,
    num_chunks_read: int,
    poll_s: float = 0.001,
    timeout_s: float = 5.0,
) -> CancelSample:
    """Call ``close`` (the client closing its stream), then poll ``read_state`` until the request count
    and the used KV blocks are each back to ``baseline``; the time of each, from just before ``close``."""
    began = time.perf_counter()
    await close()
    requests_ms: float | None = None
    kv_ms: float | None = None
    while (requests_ms is None or kv_ms is None) and time.perf_counter() - began < timeout_s:
        state = await read_state()
        now_ms = (time.perf_counter() - began) * 1000
        if requests_ms is None and state.num_active <= baseline.num_active:
            requests_ms = now_ms
        if kv_ms is None and state.num_kv_blocks_used <= baseline.num_kv_blocks_used:
            kv_ms = now_ms
        await asyncio.sleep(poll_s)
    return CancelSample(requests_ms, kv_ms, num_chunks_read)


async def text_chunks(resp: httpx.Response) -> AsyncIterator[str]:
    """The text of each SSE event that carries some."""
    async for line in resp.aiter_lines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            if chunk.get("choices") and (text := chunk["choices"][0].get("text")):
                yield text


async def cancel_one(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    index: int,
    read_state: Callable[[], Awaitable[ReplicaState]],
) -> CancelSample:
    """One stream: read ``--tokens`` chunks, make sure the replica's gauges show it, close it, and time
    the replica getting back to what it held before the stream."""
    baseline = await read_state()
    body = {"model": args.model, "prompt": f"Cancel me, number {index}.", "max_tokens": args.max_tokens,
            "ignore_eos": True, "stream": True, "temperature": 0.0}  # fmt: skip
    # A connection of its own: closing the response mid-body closes it, as a client going away does.
    async with client.stream("POST", "/v1/completions", json=body, headers={"Connection": "close"}) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"stream {index}: HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")
        num_read = 0
        async for _ in text_chunks(resp):
            num_read += 1
            if num_read >= args.tokens:
                break
        if num_read < args.tokens:
            raise RuntimeError(f"stream {index} ended after {num_read} chunks, before it could be cancelled")
        await wait_visible(read_state, baseline)
        return await wait_freed(resp.aclose, read_state, baseline, num_read, timeout_s=args.timeout_s)


async def wait_visible(
    read_state: Callable[[], Awaitable[ReplicaState]], baseline: ReplicaState, timeout_s: float = 1.0
) -> None:
    """Until the replica's gauges show the stream (else its freeing could not be seen either)."""
    deadline = time.monotonic() + timeout_s
    while not (await read_state()).holds_more_than(baseline):
        if time.monotonic() > deadline:
            raise RuntimeError("the replica's metrics never showed the stream: are its stats exported?")
        await asyncio.sleep(0.001)


async def wait_idle(read_state: Callable[[], Awaitable[ReplicaState]], timeout_s: float = 30.0) -> None:
    """Until the replica holds no request (the previous stream's end, the gateway's probes)."""
    deadline = time.monotonic() + timeout_s
    while (await read_state()).num_active > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not become idle")
        await asyncio.sleep(0.01)


async def run(args: argparse.Namespace, base_url: str, metrics_url: str) -> list[CancelSample]:
    samples: list[CancelSample] = []
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with (
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as client,
        httpx.AsyncClient(timeout=5) as metrics,
    ):

        async def read_state() -> ReplicaState:
            return parse_replica_state((await metrics.get(metrics_url)).text)

        for index in range(-1, args.streams):  # stream -1 warms up the path, not counted
            await wait_idle(read_state)
            sample = await cancel_one(client, args, index, read_state)
            if index >= 0:
                samples.append(sample)
                log(f"stream {index}: freed {_ms(sample.freed_ms)} ms (request count "
                    f"{_ms(sample.requests_freed_ms)}, KV {_ms(sample.kv_freed_ms)})")  # fmt: skip
    return samples


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table_lines(args: argparse.Namespace, samples: list[CancelSample]) -> list[str]:
    freed = [s.freed_ms for s in samples if s.freed_ms is not None]
    requests = [s.requests_freed_ms for s in samples if s.requests_freed_ms is not None]
    kv = [s.kv_freed_ms for s in samples if s.kv_freed_ms is not None]
    return [
        "| streams | closed after | not freed in time | freed p50 ms | p95 ms | max ms "
        "| request count p50 / p95 ms | KV blocks p50 / p95 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(samples)} | {args.tokens} tokens | {len(samples) - len(freed)} | {pct(freed, 50):.1f} | "
        f"{pct(freed, 95):.1f} | {max(freed, default=float('nan')):.1f} | {pct(requests, 50):.1f} / "
        f"{pct(requests, 95):.1f} | {pct(kv, 50):.1f} / {pct(kv, 95):.1f} |",
    ]


def report_lines(args: argparse.Namespace, samples: list[CancelSample], load: str) -> list[str]:
    return [
        f"CPU: {cpu_description()}; {load}. One stream at a time through the gateway to one tritonserver "
        f"replica, each closed by the client after {args.tokens} text chunks (tokens: safety policy none) of "
        f"up to {args.max_tokens}; freed = the replica's active request count and used KV blocks both back "
        f"to their value before the stream, from its Triton metrics polled every ~1 ms (the engine exports "
        f"them every {args.stats_interval_ms:g} ms, the resolution of these figures). The replica asks "
        f"Triton whether a request was cancelled once per {args.cancellation_check_period_ms:g} ms "
        "(`cancellation_check_period_ms`, a rotating slice of its requests per engine step): most of the "
        "latency is that sweep's wait.",
        "",
        *table_lines(args, samples),
        "",
        f"![cancel-to-free latency]({PLOT.relative_to(REPO_ROOT / 'docs')})",
    ]


def start_stack(args: argparse.Namespace) -> SluiceStack:
    """The stack on free ports over a repository rendered for this bench (fast stats export), its files
    under ``--work-dir``."""
    repository = args.work_dir / "model_repository"
    settings = CpuEngineModelSettings(
        checkpoint_dir=args.checkpoint.resolve(), stats_interval_ms=args.stats_interval_ms
    )
    args.cancellation_check_period_ms = settings.cancellation_check_period_ms  # for the report
    render_model_repository(repository, settings)
    stack = SluiceStack(
        repository, "", args.work_dir / "devstack.log", state_dir=args.work_dir / "state",
        checkpoint_dir=args.checkpoint, ports=StackPorts.free(),
    )  # fmt: skip
    none_tenant = dataclasses.replace(dev_tenant(TENANT_ID), safety_policy="none")
    stack.put_tenant(none_tenant, API_KEY)
    stack.start()
    return stack


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--tokens", type=int, default=8, help="text chunks read before the client closes")
    ap.add_argument("--max-tokens", type=int, default=512, help="what each stream asks for (the limit)")
    ap.add_argument("--stats-interval-ms", type=float, default=5.0, help="the replica's stats export")
    ap.add_argument("--timeout-s", type=float, default=5.0, help="a stream not freed by then counts as such")
    ap.add_argument("--checkpoint", type=Path, default=Path(".sluice/models/sluice-tiny"))
    ap.add_argument("--model", default="sluice-tiny")
    ap.add_argument("--work-dir", type=Path, default=WORK_DIR, help="the stack's repository, state and log")
    ap.add_argument("--write-docs", action="store_true", help="the plot, its JSON and the docs section")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join([".venv/bin/python -m bench.cancel_bench", *(sys.argv[1:] if argv is None else argv)])
    stack = start_stack(args)
    try:
        assert stack.ports is not None
        samples = asyncio.run(run(args, stack.base_url, stack.ports.metrics_url))
        load = f"{load_average()} at the end (other work on the same cores)"
    finally:
        stack.stop()
    lines = table_lines(args, samples)
    print("\n".join(lines))
    if args.write_docs:
        freed = [s.freed_ms for s in samples if s.freed_ms is not None]
        plots.save_json(PLOT, {"command": command, "samples": [dataclasses.asdict(s) for s in samples]})
        plots.cancel_histogram(freed, PLOT, f"{len(freed)} streams closed after {args.tokens} tokens")
        write_measured(SECTION, command, report_lines(args, samples, load))
        log(f"wrote {PLOT} and section {SECTION!r} of docs/benchmarks.md")
    return 0 if all(s.freed_ms is not None for s in samples) else 1


if __name__ == "__main__":
    sys.exit(main())
