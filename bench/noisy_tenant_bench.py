"""One tenant floods a running gateway; does another tenant's stream stay fast?

Against `make run` (one replica). Two phases, the same quiet tenant in both:

1. unloaded: the quiet tenant (acme) alone sends ``--quiet-streams`` concurrent streams of
   ``--quiet-tokens`` tokens, one after another, for ``--duration-s``;
2. flooded: the flooding tenant (globex) keeps ``--flood-streams`` streams of ``--flood-tokens`` tokens
   going (a stream refused with 429, over its tenant's concurrency cap, waits the Retry-After and tries
   again), and after ``--warmup-s`` the quiet tenant runs exactly as in phase 1.

Reported: the quiet tenant's time to first token p50 / p95 and inter-chunk gap p50 / p95 (a chunk is one
SSE event with text: the gap the reader sees) in each phase, the target the issue sets (TTFT p95 under
max(3 x unloaded p95, 250 ms), gap p95 under SLUICE_ITL_TARGET_MS), and each tenant's output tokens/s
during the flood.

    .venv/bin/python -m bench.noisy_tenant_bench            # against `make run` on :8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass, field

import httpx

from bench.report import cpu_description, pct, write_measured


@dataclass
class Tally:
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    num_tokens: int = 0
    num_failed: int = 0
    num_refused: int = 0


async def stream_once(
    client: httpx.AsyncClient, model: str, key: str, prompt: str, num_tokens: int, tally: Tally
) -> float:
    """One streamed completion; its timings go into ``tally``. Returns the Retry-After of a 429 (else 0)."""
    body = {"model": model, "prompt": prompt, "max_tokens": num_tokens, "ignore_eos": True, "stream": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}  # fmt: skip
    sent = time.perf_counter()
    last: float | None = None
    async with client.stream(
        "POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        if resp.status_code == 429:
            tally.num_refused += 1
            return float(resp.headers.get("retry-after", "1"))
        if resp.status_code != 200:
            tally.num_failed += 1
            return 0.0
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                tally.num_failed += 1
                return 0.0
            if chunk.get("usage"):
                tally.num_tokens += chunk["usage"]["completion_tokens"]
            if not (chunk.get("choices") and chunk["choices"][0].get("text")):
                continue
            now = time.perf_counter()
            if last is None:
                tally.ttft_ms.append((now - sent) * 1000)
            else:
                tally.gaps_ms.append((now - last) * 1000)
            last = now
    return 0.0


async def loop(
    client: httpx.AsyncClient, args: argparse.Namespace, key: str, prompt: str, num_tokens: int,
    tally: Tally, stop: asyncio.Event,
) -> None:  # fmt: skip
    while not stop.is_set():
        try:
            retry_after_s = await stream_once(client, args.model, key, prompt, num_tokens, tally)
        except httpx.TransportError:  # e.g. a keep-alive connection the server closed as it was reused
            tally.num_failed += 1
            continue
        if retry_after_s:
            await asyncio.sleep(min(retry_after_s, 0.5))


async def quiet_phase(client: httpx.AsyncClient, args: argparse.Namespace) -> tuple[Tally, float]:
    tally = Tally()
    stop = asyncio.Event()
    began = time.perf_counter()
    tasks = [
        asyncio.create_task(loop(client, args, args.quiet_key, f"Quiet {i}", args.quiet_tokens, tally, stop))
        for i in range(args.quiet_streams)
    ]
    await asyncio.sleep(args.duration_s)
    stop.set()
    await asyncio.gather(*tasks)
    return tally, time.perf_counter() - began


async def run(args: argparse.Namespace) -> list[str]:
    limits = httpx.Limits(max_connections=args.flood_streams + args.quiet_streams + 8)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=600, limits=limits) as client:
        await stream_once(client, args.model, args.quiet_key, "warm", 8, Tally())
        unloaded, _ = await quiet_phase(client, args)
        flood = Tally()
        stop = asyncio.Event()
        began = time.perf_counter()
        flooders = [
            asyncio.create_task(
                loop(client, args, args.flood_key, f"Flood {i}", args.flood_tokens, flood, stop)
            )
            for i in range(args.flood_streams)
        ]
        await asyncio.sleep(args.warmup_s)
        flooded, quiet_s = await quiet_phase(client, args)
        stop.set()
        await asyncio.gather(*flooders)
        flood_s = time.perf_counter() - began
    itl_target_ms = float(os.environ.get("SLUICE_ITL_TARGET_MS", "50"))
    ttft_bound_ms = max(3 * pct(unloaded.ttft_ms, 95), 250.0)
    met = pct(flooded.ttft_ms, 95) < ttft_bound_ms and pct(flooded.gaps_ms, 95) < itl_target_ms
    return [
        f"CPU: {cpu_description()}. Flood: {args.flood_key.split('-')[1]} keeps {args.flood_streams} "
        f"streams of {args.flood_tokens} tokens going; quiet: {args.quiet_key.split('-')[1]}, "
        f"{args.quiet_streams} streams of {args.quiet_tokens} tokens for {args.duration_s:.0f} s "
        f"(after {args.warmup_s:.0f} s of flood).",
        "",
        "| quiet tenant | requests | failed | TTFT p50 ms | TTFT p95 ms | gap p50 ms | gap p95 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
        _row("unloaded", unloaded),
        _row("during the flood", flooded),
        "",
        f"Target: TTFT p95 under {ttft_bound_ms:.0f} ms, gap p95 under {itl_target_ms:.0f} ms: "
        f"**{'met' if met else 'not met'}**. During the flood: flooding tenant "
        f"{flood.num_tokens / flood_s:,.0f} output tokens/s ({flood.num_refused} streams refused with 429 "
        f"and retried, {flood.num_failed} failed), quiet tenant "
        f"{flooded.num_tokens / quiet_s:,.0f} tokens/s.",
    ]


def _row(label: str, tally: Tally) -> str:
    return (
        f"| {label} | {len(tally.ttft_ms)} | {tally.num_failed} | {pct(tally.ttft_ms, 50):.0f} | "
        f"{pct(tally.ttft_ms, 95):.0f} | {pct(tally.gaps_ms, 50):.1f} | {pct(tally.gaps_ms, 95):.1f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080")
    ap.add_argument("--model", default="sluice-tiny")
    ap.add_argument("--quiet-key", default="sk-acme-dev")
    ap.add_argument("--flood-key", default="sk-globex-dev")
    ap.add_argument("--flood-streams", type=int, default=200)
    ap.add_argument("--flood-tokens", type=int, default=400)
    ap.add_argument("--quiet-streams", type=int, default=2)
    ap.add_argument("--quiet-tokens", type=int, default=64)
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument(
        "--write-docs", action="store_true", help="replace this bench's section of docs/benchmarks.md"
    )
    args = ap.parse_args()
    lines = asyncio.run(run(args))
    print("\n".join(lines))
    if args.write_docs:
        command = (
            f"python -m bench.noisy_tenant_bench --flood-streams {args.flood_streams} "
            f"--flood-tokens {args.flood_tokens} --quiet-streams {args.quiet_streams} "
            f"--duration-s {args.duration_s:.0f}"
        )
        write_measured("noisy-tenant", f"{command} --write-docs", lines)


if __name__ == "__main__":
    main()
