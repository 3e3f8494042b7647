"""What the gateway adds to time-to-first-token: the same request through the gateway and straight to Triton.

One request at a time (no queueing), alternating gateway and direct so both see the same machine state;
the same prompt token ids, 4 output tokens. Direct = tritonclient.grpc.aio against the replica the gateway
uses; gateway = POST /v1/completions (stream) with httpx. Quotes p50/p99 of each and of the difference.

    .venv/bin/python -m bench.gateway_overhead --base-url http://127.0.0.1:8080/v1 --grpc-url 127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
import numpy as np
import tritonclient.grpc.aio as grpcclient

from bench.report import pct
from sluice.triton.client import GenerateStream
from sluice.triton.converters import request_tensors


async def gateway_ttft_ms(client: httpx.AsyncClient, model: str, prompt: list[int]) -> float:
    body = {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0.0, "stream": True}
    sent = time.perf_counter()
    first = None
    async with client.stream("POST", "/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    first = time.perf_counter()
    assert first is not None, "no text chunk"
    return (first - sent) * 1000


async def direct_ttft_ms(client: grpcclient.InferenceServerClient, model: str, prompt: list[int]) -> float:
    sent = time.perf_counter()
    first = None
    async with GenerateStream(client, model, request_tensors(prompt, 4, temperature=0.0)) as stream:
        async for chunk in stream:
            if first is None and chunk.token_ids:
                first = time.perf_counter()
    assert first is not None, "no tokens"
    return (first - sent) * 1000


async def run(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(args.seed)
    headers = {"Authorization": f"Bearer {args.api_key}"}
    grpc = grpcclient.InferenceServerClient(args.grpc_url)
    gateway_ms: list[float] = []
    direct_ms: list[float] = []
    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=60) as http:
        for i in range(args.requests + 5):
            prompt = rng.integers(3, 8192, args.prompt_len).tolist()
            g = await gateway_ttft_ms(http, args.model, prompt)
            d = await direct_ttft_ms(grpc, args.model, prompt[::-1])  # distinct: no prefix-cache hit
            if i >= 5:  # the first few warm both paths up
                gateway_ms.append(g)
                direct_ms.append(d)
    await grpc.close()
    added = [g - d for g, d in zip(gateway_ms, direct_ms, strict=True)]
    print(f"requests: {len(added)} each way, prompt {args.prompt_len} tokens")
    print(f"direct to Triton TTFT ms  p50 {pct(direct_ms, 50):.2f}  p99 {pct(direct_ms, 99):.2f}")
    print(f"through gateway TTFT ms   p50 {pct(gateway_ms, 50):.2f}  p99 {pct(gateway_ms, 99):.2f}")
    print(f"added by gateway ms       p50 {pct(added, 50):.2f}  p99 {pct(added, 99):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--grpc-url", default="127.0.0.1:8001")
    ap.add_argument("--api-key", default="sk-acme-dev")
    ap.add_argument("--model", default="sluice-tiny")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
