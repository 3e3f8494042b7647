"""What issue 25's request features cost in the CPU engine (no server): the engine stepped in this process's
main thread, 32 streams in a closed loop (a new request starts when one ends), distinct random 128-token
prompts, 128 output tokens each, sampled (temperature 1, a seed per request), so every figure is the
engine's own work.

- structured output: none, against half of the requests constrained to a typical 20-field JSON schema
  (target: at most 10% fewer tok/s), and the schema's compile time, cold and cached;
- log-probabilities: none, against every request asking for 5 alternatives per token;
- n = 4: one request with n = 4 against 4 separate requests of the same 1,024-token prompt (8 such groups
  at once): the time until all 4 answers have their first token, and tok/s.

    .venv/bin/python -m bench.features_bench --model .sluice/models/sluice-tiny --write-docs
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.report import cpu_description, cpu_flags, load_average, pct, write_section
from cpu_engine.config import EngineConfig
from cpu_engine.engine import LLMEngine
from cpu_engine.runner import StepSamples
from cpu_engine.sampling import SamplingParams
from cpu_engine.step_plan import SchedulerOutput
from sluice.wire import Guide, GuideKind

SCHEMA = {
    "type": "object",
    "properties": {
        **{f"name_{i}": {"type": "string", "minLength": 24, "maxLength": 48} for i in range(6)},
        **{f"count_{i}": {"type": "integer", "minimum": 0, "maximum": 100_000} for i in range(6)},
        **{f"ratio_{i}": {"type": "number"} for i in range(3)},
        **{f"flag_{i}": {"type": "boolean"} for i in range(3)},
        "kind": {"enum": ["alpha", "beta", "gamma"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 4},
    },
    "required": [*(f"name_{i}" for i in range(6)), "kind"],
    "additionalProperties": False,
}
GUIDE = Guide(GuideKind.JSON_SCHEMA, json.dumps(SCHEMA))


@dataclass
class Run:
    label: str
    output_tokens_per_s: float
    num_tokens: int
    median_step_ms: float


def closed_loop(
    engine: LLMEngine, params_of: Callable[[int], SamplingParams], concurrency: int, num_requests: int,
    prompt_len: int, seed: int,
) -> tuple[float, int, float]:  # fmt: skip
    """Output tok/s, tokens and median step ms for ``num_requests`` requests, ``concurrency`` at a time."""
    rng = np.random.default_rng(seed)
    started = 0
    live: set[str] = set()
    num_tokens, steps_ms = 0, []

    def start() -> None:
        nonlocal started
        prompt = rng.integers(3, engine.model_config.vocab_size, prompt_len).tolist()
        request_id = f"r{started}"
        engine.add_request(request_id, prompt, params_of(started), cache_scope=request_id)
        live.add(request_id)
        started += 1

    while started < min(concurrency, num_requests):
        start()
    began = time.perf_counter()
    while live:
        step_began = time.perf_counter()
        outputs = engine.step()
        steps_ms.append((time.perf_counter() - step_began) * 1000)
        for out in outputs:
            num_tokens += len(out.new_token_ids)
            if out.request_finished:
                live.discard(out.request_id)
                if started < num_requests:
                    start()
    elapsed = time.perf_counter() - began
    return num_tokens / elapsed, num_tokens, float(np.median(steps_ms))


def sampled(i: int, output_len: int, **extra: object) -> SamplingParams:
    return SamplingParams(max_tokens=output_len, temperature=1.0, seed=i, **extra)  # type: ignore[arg-type]


def n_against_separate(
    engine: LLMEngine, groups: int, prompt_len: int, output_len: int, seed: int
) -> list[str]:
    """Rows for one request with n = 4 against 4 separate requests, ``groups`` prompts at once."""
    rng = np.random.default_rng(seed)
    rows = []
    computed: list[int] = []
    execute = engine.runner.execute

    def counting(out: SchedulerOutput) -> StepSamples:
        computed.append(out.num_prefill_tokens)
        return execute(out)

    engine.runner.execute = counting  # type: ignore[method-assign]
    for label, per_group in (("4 separate requests", 4), ("n = 4 (one request)", 1)):
        computed.clear()
        prompts = [
            rng.integers(3, engine.model_config.vocab_size, prompt_len).tolist() for _ in range(groups)
        ]
        first: dict[tuple[int, int], float] = {}
        began = time.perf_counter()
        for g, prompt in enumerate(prompts):
            for k in range(per_group):
                n = 4 if per_group == 1 else 1
                params = SamplingParams(
                    max_tokens=output_len, temperature=1.0, seed=g * 4 + k, n=n, ignore_eos=True
                )
                engine.add_request(f"g{g}-{k}", prompt, params, cache_scope=f"g{g}")  # one tenant per group
        num_tokens = 0
        while engine.has_unfinished():
            for out in engine.step():
                num_tokens += len(out.new_token_ids)
                group, k = (int(x) for x in out.request_id[1:].split("-"))
                first.setdefault((group, k + out.index), time.perf_counter() - began)  # answer k or index
        elapsed = time.perf_counter() - began
        ttft = [max(first[(g, a)] for a in range(4)) * 1000 for g in range(groups)]
        tok_s = num_tokens / elapsed
        ttft_ms = f"{pct(ttft, 50):,.0f} | {pct(ttft, 95):,.0f}"
        rows.append(f"| {label} | {groups} x 4 | {sum(computed):,} | {ttft_ms} | {tok_s:,.0f} |")
    engine.runner.execute = execute  # type: ignore[method-assign]
    return rows


def compile_times(engine: LLMEngine, repeats: int) -> tuple[float, float]:
    """Cold compile of the 20-field schema (a fresh schema text each time), and a cached start, in ms."""
    assert engine.grammar is not None
    cold, cached = [], []
    for i in range(repeats):
        guide = Guide(GuideKind.JSON_SCHEMA, json.dumps({**SCHEMA, "description": f"run {i}"}))
        began = time.perf_counter()
        engine.grammar.matcher(guide)
        cold.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        engine.grammar.matcher(guide)
        cached.append((time.perf_counter() - began) * 1000)
    return float(np.median(cold)), float(np.median(cached))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=".sluice/models/sluice-tiny")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2, help="each variant this many times, alternating")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()

    engine = LLMEngine.from_checkpoint(args.model, EngineConfig(num_kv_blocks=4096, max_num_running=64))
    out_len = args.output_len

    def half_guided(i: int) -> SamplingParams:
        return sampled(i, out_len, guide=GUIDE) if i % 2 else sampled(i, out_len, ignore_eos=True)

    variants: dict[str, Callable[[int], SamplingParams]] = {
        "plain": lambda i: sampled(i, out_len, ignore_eos=True),
        "half JSON-schema constrained": half_guided,
        "logprobs, 5 alternatives": lambda i: sampled(i, out_len, ignore_eos=True, logprobs=5),
    }
    closed_loop(engine, variants["plain"], args.concurrency, args.concurrency, args.prompt_len, 0)  # warm-up
    results: dict[str, list[Run]] = {label: [] for label in variants}
    for r in range(args.rounds):
        for label, params_of in variants.items():
            tok_s, tokens, step_ms = closed_loop(
                engine, params_of, args.concurrency, args.requests, args.prompt_len, seed=100 + r
            )
            results[label].append(Run(label, tok_s, tokens, step_ms))
            print(f"round {r + 1}: {label}: {tok_s:,.0f} tok/s ({tokens} tokens, step p50 {step_ms:.1f} ms)")
    plain = float(np.median([run.output_tokens_per_s for run in results["plain"]]))
    rows = []
    for label, runs in results.items():
        tok_s = float(np.median([run.output_tokens_per_s for run in runs]))
        step_ms = float(np.median([run.median_step_ms for run in runs]))
        rows.append(f"| {label} | {tok_s:,.0f} | {tok_s / plain:.2f} | {step_ms:.1f} |")
    cold_ms, cached_ms = compile_times(engine, 5)
    n_rows = n_against_separate(engine, groups=8, prompt_len=1024, output_len=64, seed=7)
    body = "\n".join(
        [
            "## What structured output, logprobs and n cost in the CPU engine (issue 25)",
            "",
            f"`{' '.join(['.venv/bin/python -m bench.features_bench', '--model', args.model])}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, on {cpu_description()} "
            f"(flags: {cpu_flags()}); {load_average()} at the end.",
            "",
            f"The engine alone, {args.concurrency} streams in a closed loop, {args.requests} requests of "
            f"{args.prompt_len} prompt + {out_len} output tokens, sampled; medians of {args.rounds} rounds "
            "that alternate the variants. A constrained request is cut at 128 tokens like the others unless "
            "its JSON ends first.",
            "",
            "| variant | output tok/s | vs plain | step p50 ms |",
            "|---|---:|---:|---:|",
            *rows,
            "",
            f"Compiling the 20-field schema (llguidance, this tokenizer): **{cold_ms:.2f} ms cold, "
            f"{cached_ms * 1000:.0f} us from the cache** (a copy of the compiled matcher; median of 5).",
            "",
            "n = 4 against 4 separate requests: 8 prompts of 1,024 tokens at once, 64 output tokens per "
            "answer, each prompt's requests in one tenant (the prefix cache shares what the first computed "
            "with the others once it is computed); TTFT is until all 4 answers of a prompt have their "
            "first token.",
            "",
            "| how | answers | prompt tokens computed | TTFT p50 ms | TTFT p95 ms | output tok/s |",
            "|---|---:|---:|---:|---:|---:|",
            *n_rows,
        ]
    )
    print(body)
    if args.write_docs:
        write_section("features", body)


if __name__ == "__main__":
    main()
