"""Does a batch take only what interactive traffic leaves? Against `make run` (one replica).

Two phases, the same interactive load in both: ``--streams`` concurrent streaming chat completions of
``--tokens`` tokens each, one after another per stream, for ``--duration-s``:

1. alone;
2. while a batch of ``--lines`` completion lines (``--line-tokens`` each, ``ignore_eos``) runs through the
   Batch API (created just before the phase; the runner fills the replica with batch-class requests).

Reported: the interactive time to first token p50 / p95 and inter-chunk gap p50 / p95 in each phase and
their ratio, and the batch's progress during phase 2 (lines done, output tokens/s) and how long the
whole batch took. The batch's lines are billed at the batch class (one usage row per line: checked).

    .venv/bin/python -m bench.batch_yield                 # against `make run` on :8080
    .venv/bin/python -m bench.batch_yield --write-docs    # and record it in docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
from dataclasses import dataclass, field

import httpx
import openai

from bench.report import cpu_description, cpu_flags, load_average, pct, write_measured

MODEL = "sluice-tiny"


@dataclass
class Phase:
    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    num_requests: int = 0
    num_errors: int = 0

    def row(self, name: str) -> str:
        ms = [pct(self.ttft_s, 50) * 1000, pct(self.ttft_s, 95) * 1000]
        gap_ms = [pct(self.gaps_s, 50) * 1000, pct(self.gaps_s, 95) * 1000]
        return (
            f"| {name} | {self.num_requests} | {self.num_errors} | {ms[0]:.0f} | {ms[1]:.0f} | "
            f"{gap_ms[0]:.1f} | {gap_ms[1]:.1f} |"
        )


async def _one_stream(http: httpx.AsyncClient, key: str, tokens: int, phase: Phase) -> None:
    body = {
        "model": MODEL,
        "stream": True,
        "max_tokens": tokens,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "Tell me a story."}],
    }
    start = time.monotonic()
    last: float | None = None
    async with http.stream(
        "POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as resp:
        if resp.status_code != 200:
            await resp.aread()
            phase.num_errors += 1
            return
        async for raw in resp.aiter_lines():
            if not raw.startswith("data: {") or '"content":"' not in raw or '"content":""' in raw:
                continue
            now = time.monotonic()
            if last is None:
                phase.ttft_s.append(now - start)
            else:
                phase.gaps_s.append(now - last)
            last = now
    phase.num_requests += 1


async def interactive(base_url: str, key: str, streams: int, tokens: int, duration_s: float) -> Phase:
    phase = Phase()
    deadline = time.monotonic() + duration_s
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:

        async def loop() -> None:
            while time.monotonic() < deadline:
                await _one_stream(http, key, tokens, phase)

        await asyncio.gather(*(loop() for _ in range(streams)))
    return phase


def create_batch(client: openai.OpenAI, lines: int, line_tokens: int) -> str:
    rows = [
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {
                    "model": MODEL,
                    "prompt": f"Item {i}:",
                    "max_tokens": line_tokens,
                    "ignore_eos": True,
                },
            }
        )
        for i in range(lines)
    ]
    file_id = client.files.create(
        file=("bench.jsonl", io.BytesIO("\n".join(rows).encode())), purpose="batch"
    ).id
    return client.batches.create(
        input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
    ).id


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")
    parser.add_argument("--key", default="sk-acme-dev", help="the interactive tenant")
    parser.add_argument("--batch-key", default="sk-globex-dev", help="the batch's tenant")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--lines", type=int, default=400)
    parser.add_argument("--line-tokens", type=int, default=128)
    parser.add_argument(
        "--label", default="", help="the stack's configuration, e.g. SLUICE_BATCH_ITL_FRACTION=0.3"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()

    print(f"phase 1: {args.streams} interactive streams alone for {args.duration_s:.0f} s", flush=True)
    alone = asyncio.run(interactive(args.base_url, args.key, args.streams, args.tokens, args.duration_s))
    batch_client = openai.OpenAI(base_url=args.base_url + "/v1", api_key=args.batch_key, max_retries=2)
    batch_id = create_batch(batch_client, args.lines, args.line_tokens)
    started_s = time.monotonic()
    print(f"phase 2: the same beside batch {batch_id} ({args.lines} lines)", flush=True)
    time.sleep(1.0)  # the runner claims it and fills the replica
    during = asyncio.run(interactive(args.base_url, args.key, args.streams, args.tokens, args.duration_s))
    in_phase = batch_client.batches.retrieve(batch_id)
    done_in_phase = in_phase.request_counts.completed if in_phase.request_counts else 0
    phase_s = time.monotonic() - started_s
    while (batch := batch_client.batches.retrieve(batch_id)).status not in {
        "completed",
        "failed",
        "cancelled",
        "expired",
    }:
        time.sleep(0.5)
    batch_s = time.monotonic() - started_s
    counts = batch.request_counts
    assert counts is not None
    usage = httpx.get(
        f"{args.base_url}/v1/usage",
        params={"limit": "1000", "request_class": "batch"},
        headers={"Authorization": f"Bearer {args.batch_key}"},
    ).json()
    rows = [r for r in usage["data"] if r["request_id"].startswith(batch_id)]

    ratio_p95 = pct(during.ttft_s, 95) / pct(alone.ttft_s, 95)
    lines = [
        f"CPU: {cpu_description()} (flags: {cpu_flags()}). One replica (`make run`"
        + (f" with {args.label}" if args.label else ", default settings")
        + f"), the dev model; {load_average()} at the end.",
        f"Interactive: {args.streams} streams of {args.tokens} tokens (acme); batch: {args.lines} lines of "
        f"{args.line_tokens} tokens (globex), the runner's SLUICE_BATCH_LINE_CONCURRENCY lines in flight.",
        "",
        "| interactive phase | requests | errors | TTFT p50 ms | TTFT p95 ms | gap p50 ms | gap p95 ms |",
        "|---|---|---|---|---|---|---|",
        alone.row("alone"),
        during.row("beside the batch"),
        "",
        f"Interactive TTFT p95 beside the batch: {ratio_p95:.2f}x alone. During the phase the batch "
        f"finished {done_in_phase} lines ({done_in_phase * args.line_tokens / phase_s:.0f} output tok/s); "
        f"the whole batch took {batch_s:.1f} s ({counts.completed} completed, {counts.failed} failed, "
        f"{len(rows)} usage rows at the batch class).",
    ]
    print("\n".join(lines))
    if args.write_docs:
        label = f" --label {args.label}" if args.label else ""
        command = f".venv/bin/python -m bench.batch_yield{label} --write-docs   # against `make run`"
        section = "batch-yield" + (f" {args.label.lower()}" if args.label else "")
        write_measured(section, command, lines)


if __name__ == "__main__":
    main()
