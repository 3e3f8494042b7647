"""End to end through an OpenAI-compatible server: Sluice's gateway (over Triton) or vLLM, same client.

Closed loop: C streams in flight against POST /v1/completions (stream, include_usage), each with a
distinct random prompt of exactly N token ids and exactly M output tokens (`ignore_eos`, an extension
both Sluice and vLLM accept). Tokens are counted from `usage`, not from chunks. TTFT is from sending
the request to the first chunk carrying text; ITL is the gap between consecutive text chunks; TPOT is
per request, (last text chunk - first) / (tokens - 1), which chunks arriving in bursts do not skew: its
p95 is the tail of the streams' pace where an ITL p95 would count each burst as a long gap and near-zero
ones.

    # against a running `make run` (gateway on 8080):
    .venv/bin/python -m bench.e2e_bench --base-url http://127.0.0.1:8080/v1 --api-key sk-acme-dev
    # against vLLM serving the same checkpoint (../shared/anchors/vllm-cpu/serve.sh ... 8011):
    .venv/bin/python -m bench.e2e_bench --base-url http://127.0.0.1:8011/v1 --label vllm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.report import pct


@dataclass
class Timeline:
    sent_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    completion_tokens: int = 0


@dataclass
class Summary:
    label: str
    concurrency: int
    num_requests: int
    elapsed_s: float
    output_tokens: int
    ttft_ms: list[float]
    itl_ms: list[float]
    # Per request: (last text chunk - first) / (tokens - 1), which chunks arriving in bursts do not skew.
    tpot_ms: list[float] = field(default_factory=list)
    num_chunks: int = 0  # chunks carrying text, over every request
    # The gaps of the requests sent after the first wave (the first `concurrency`, sent together at the
    # start, whose prefills meet each other's): a steady load's inter-token latency.
    later_itl_ms: list[float] = field(default_factory=list)
    later_ttft_ms: list[float] = field(default_factory=list)  # the same requests' TTFT

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.elapsed_s

    def row(self) -> str:
        return (
            f"| {self.label} | {self.concurrency} | {self.num_requests} | {self.tokens_per_s:,.0f} | "
            f"{pct(self.ttft_ms, 50):.1f} | {pct(self.ttft_ms, 95):.1f} | {pct(self.ttft_ms, 99):.1f} | "
            f"{pct(self.itl_ms, 50):.1f} | {pct(self.itl_ms, 95):.1f} | "
            f"{pct(self.tpot_ms, 50):.2f} | {pct(self.tpot_ms, 95):.2f} |"
        )


HEADER = (
    "| server | concurrency | requests | output tok/s | TTFT p50 ms | TTFT p95 ms | TTFT p99 ms "
    "| ITL p50 ms | ITL p95 ms | TPOT p50 ms | TPOT p95 ms |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def request_tpot_ms(timeline: Timeline) -> float | None:
    """One request's time per output token after the first: (last text chunk - first) / (tokens - 1);
    None without two tokens or any text chunk."""
    if not timeline.chunk_times_s or timeline.completion_tokens < 2:
        return None
    return (timeline.chunk_times_s[-1] - timeline.chunk_times_s[0]) * 1000 / (timeline.completion_tokens - 1)


async def one_request(client: httpx.AsyncClient, model: str, prompt: list[int], output_len: int) -> Timeline:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timeline = Timeline(time.perf_counter())
    async with client.stream("POST", "/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                timeline.chunk_times_s.append(time.perf_counter())
            if chunk.get("usage"):
                timeline.completion_tokens = chunk["usage"]["completion_tokens"]
    return timeline


def plain_prompt_ids(checkpoint_dir: Path) -> list[int]:
    """The ids of the checkpoint's (byte-level BPE) vocabulary that random prompts may be drawn from: no
    special token, and none with a digit or an "@" in it, so that no random prompt can look like a card
    number or an e-mail address to Sluice's PII screen (which blocks such a prompt with 400)."""
    spec = json.loads((checkpoint_dir / "tokenizer.json").read_text())
    special = {t["id"] for t in spec.get("added_tokens", [])}
    vocab: dict[str, int] = spec["model"]["vocab"]
    return sorted(i for token, i in vocab.items() if i not in special and not re.search(r"[0-9@]", token))


async def run_load(
    base_url: str,
    api_key: str,
    model: str,
    concurrency: int,
    num_requests: int,
    prompt_len: int,
    output_len: int,
    vocab: int,
    seed: int,
    label: str,
    prompt_ids: Sequence[int] | None = None,
) -> Summary:
    """One closed-loop run; prompts are drawn from ``prompt_ids`` (default: ids 3.., which avoids the
    dev tokenizer's special tokens)."""
    rng = np.random.default_rng(seed)
    pool = np.asarray(prompt_ids if prompt_ids is not None else range(3, vocab))
    # Distinct random prompts defeat prefix caches.
    num_warm_up = concurrency
    prompts = [
        pool[rng.integers(0, len(pool), prompt_len)].tolist() for _ in range(num_requests + num_warm_up)
    ]
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=120) as client:
        # Warm-up, not measured: one wave of short answers, so the measured first wave meets open
        # connections and a server that has already run a wave of this size (KV pages touched, first
        # calls made) rather than a cold start.
        await asyncio.gather(*(one_request(client, model, prompts.pop(), 8) for _ in range(num_warm_up)))
        queue: asyncio.Queue[list[int]] = asyncio.Queue()
        for p in prompts:
            queue.put_nowait(p)
        timelines: list[Timeline] = []

        async def worker() -> None:
            while not queue.empty():
                timelines.append(await one_request(client, model, queue.get_nowait(), output_len))

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return summary_of(label, concurrency, elapsed, timelines)


def summary_of(label: str, concurrency: int, elapsed_s: float, timelines: list[Timeline]) -> Summary:
    """One run's figures from its requests' timelines."""
    timelines = sorted(timelines, key=lambda t: t.sent_s)  # in the order sent: the first wave first
    gaps_ms = [[float(d) * 1000 for d in np.diff(t.chunk_times_s)] for t in timelines]  # per request

    def ttft_ms(timelines: list[Timeline]) -> list[float]:  # of the requests with text
        return [(t.chunk_times_s[0] - t.sent_s) * 1000 for t in timelines if t.chunk_times_s]

    return Summary(
        label=label,
        concurrency=concurrency,
        num_requests=len(timelines),
        elapsed_s=elapsed_s,
        output_tokens=sum(t.completion_tokens for t in timelines),
        ttft_ms=ttft_ms(timelines),
        itl_ms=[gap for gaps in gaps_ms for gap in gaps],
        tpot_ms=[v for v in map(request_tpot_ms, timelines) if v is not None],
        num_chunks=sum(len(t.chunk_times_s) for t in timelines),
        later_itl_ms=[gap for gaps in gaps_ms[concurrency:] for gap in gaps],
        later_ttft_ms=ttft_ms(timelines[concurrency:]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="sk-acme-dev")
    ap.add_argument("--model", default="sluice-tiny")
    ap.add_argument("--label", default="sluice")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[32])
    ap.add_argument("--requests-per-slot", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument(
        "--checkpoint", type=Path, default=Path(".sluice/models/sluice-tiny"), help="its tokenizer"
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    has_tokenizer = (args.checkpoint / "tokenizer.json").exists()
    prompt_ids = plain_prompt_ids(args.checkpoint) if has_tokenizer else None
    print(HEADER)
    for c in args.concurrency:
        s = asyncio.run(
            run_load(
                args.base_url,
                args.api_key,
                args.model,
                c,
                max(8, c * args.requests_per_slot),
                args.prompt_len,
                args.output_len,
                args.vocab,
                args.seed + c,
                args.label,
                prompt_ids,
            )
        )
        print(s.row(), flush=True)


if __name__ == "__main__":
    main()
