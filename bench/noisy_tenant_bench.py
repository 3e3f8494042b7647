"""One tenant floods a running gateway; does another tenant's stream stay fast?

Against `make run` (one replica). Two phases, the same quiet tenant in both:

1. unloaded: the quiet tenant (acme) alone sends ``--quiet-streams`` concurrent streams of
   ``--quiet-tokens`` tokens, one after another, for ``--duration-s``;
2. flooded: the flooding tenant (globex) keeps ``--flood-streams`` streams of ``--flood-tokens`` tokens
   going (a stream refused with 429, over its tenant's concurrency cap, waits the Retry-After, at most
   0.5 s, and tries again), and after ``--warmup-s`` the quiet tenant runs exactly as in phase 1.

The quiet tenant is a client of its own, as it would be on another machine: each quiet phase runs in a
separate process (``--role quiet``), so its clock never waits on the flood client's event loop (which
handles thousands of SSE reads and ~140 refusals a second). The flood client is kept cheap: it parses
nothing of a stream but its last bytes (its tokens come from the final ``usage`` event). It reads each
body as it arrives: pausing between reads so that several events come in one saved ~1% of a core
(25% against 26%, measured) and risks reading slower than the server writes, which throttles the flood.

Reported: the quiet tenant's time to first token p50 / p95 and inter-chunk gap p50 / p95 as its client
saw them (a chunk is one SSE event with text: the gap the reader sees) in each phase, the target the
issue sets on those figures (TTFT p95 under max(3 x unloaded p95, 250 ms), gap p95 under
SLUICE_ITL_TARGET_MS), each tenant's output tokens/s during the flood, and beside the client's figures
the gateway's own view of the same quiet requests, from its telemetry (``--telemetry``; records matched
by the ``X-Request-Id`` each response carried): ``ttft_ms`` (from the gateway's auth guard to the first
token), ``queue_ms`` (in the gateway before the replica call) and ``replica_ttft_ms``.

    .venv/bin/python -m bench.noisy_tenant_bench            # against `make run` on :8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import sys
import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench import plots
from bench.report import cpu_description, cpu_flags, load_average, pct, write_measured
from sluice.settings import ITL_TARGET_MS

REPO_ROOT = Path(__file__).resolve().parent.parent
PLOT = REPO_ROOT / "docs" / "img" / "noisy-tenant.png"
# What the gateway's telemetry says about a request, as reported beside the client's figures.
TELEMETRY_FIELDS = ("ttft_ms", "queue_ms", "replica_ttft_ms")
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d+)')
_ERROR_EVENT = re.compile(rb'data: \{\s*"error"')
_TAIL_BYTES = 4096  # the last usage event and [DONE] fit with room to spare
_REQUEST_ID = re.compile(r'"request_id":\s*"([^"]+)"')


@dataclass
class Tally:
    ttft_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    num_tokens: int = 0
    num_failed: int = 0
    num_refused: int = 0
    request_ids: list[str] = field(default_factory=list)  # X-Request-Id of each answered stream
    elapsed_s: float = 0.0
    ttft_at_s: list[float] = field(default_factory=list)  # when each first token came, into the phase
    began: float = 0.0  # the phase's start (perf_counter), for ttft_at_s


def _post(
    client: httpx.AsyncClient, model: str, key: str, prompt: str, num_tokens: int
) -> AbstractAsyncContextManager[httpx.Response]:
    """A streamed completion of exactly ``num_tokens`` tokens, with a final usage event."""
    body = {"model": model, "prompt": prompt, "max_tokens": num_tokens, "ignore_eos": True, "stream": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}  # fmt: skip
    return client.stream("POST", "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def _refused(resp: httpx.Response, tally: Tally) -> float | None:
    """None for a 200; else counts the refusal (429) or failure in ``tally`` and returns the seconds to
    wait before the next try (the 429's Retry-After; 0 after a failure)."""
    if resp.status_code == 200:
        return None
    if resp.status_code == 429:
        tally.num_refused += 1
        return float(resp.headers.get("retry-after", "1"))
    tally.num_failed += 1
    return 0.0


async def quiet_stream(
    client: httpx.AsyncClient, model: str, key: str, prompt: str, num_tokens: int, tally: Tally
) -> float:
    """One streamed completion, every event parsed and timed into ``tally``. Returns the Retry-After of a
    429 (else 0)."""
    sent = time.perf_counter()
    last: float | None = None
    async with _post(client, model, key, prompt, num_tokens) as resp:
        if (retry_after_s := _refused(resp, tally)) is not None:
            return retry_after_s
        if request_id := resp.headers.get("x-request-id"):
            tally.request_ids.append(request_id)
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
                tally.ttft_at_s.append(now - tally.began)
            else:
                tally.gaps_ms.append((now - last) * 1000)
            last = now
    return 0.0


def stream_outcome(tail: bytes) -> tuple[bool, int]:
    """(failed, completion tokens) from a stream's last bytes: failed if it ended with an error event;
    the tokens of its last ``usage`` event (0 if none is there)."""
    if _ERROR_EVENT.search(tail):
        return True, 0
    counts = _COMPLETION_TOKENS.findall(tail)
    return False, int(counts[-1]) if counts else 0


async def flood_stream(
    client: httpx.AsyncClient,
    model: str,
    key: str,
    prompt: str,
    num_tokens: int,
    tally: Tally,
) -> float:
    """One streamed completion read as cheaply as the client can: the body as raw bytes, only its last
    bytes kept and searched once at the end. Returns the Retry-After of a 429 (else 0)."""
    async with _post(client, model, key, prompt, num_tokens) as resp:
        if (retry_after_s := _refused(resp, tally)) is not None:
            return retry_after_s
        tail = b""
        async for piece in resp.aiter_raw():
            tail = (tail + piece)[-_TAIL_BYTES:]
    failed, tokens = stream_outcome(tail)
    tally.num_failed += failed
    tally.num_tokens += tokens
    return 0.0


async def flood_loop(
    client: httpx.AsyncClient, args: argparse.Namespace, prompt: str, tally: Tally, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            retry_after_s = await flood_stream(
                client, args.model, args.flood_key, prompt, args.flood_tokens, tally
            )
        except httpx.TransportError:  # e.g. a keep-alive connection the server closed as it was reused
            tally.num_failed += 1
            continue
        if retry_after_s:
            await asyncio.sleep(min(retry_after_s, 0.5))


async def quiet_role(args: argparse.Namespace) -> Tally:
    """``--role quiet``: ``--quiet-streams`` loops of streams for ``--duration-s``, after one warm-up
    request (not counted) that opens a connection."""
    tally = Tally()
    limits = httpx.Limits(max_connections=args.quiet_streams + 2)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=600, limits=limits) as client:
        await quiet_stream(client, args.model, args.quiet_key, "warm", 8, Tally())
        stop = asyncio.Event()

        async def loop(prompt: str) -> None:
            while not stop.is_set():
                try:
                    retry_after_s = await quiet_stream(
                        client, args.model, args.quiet_key, prompt, args.quiet_tokens, tally
                    )
                except httpx.TransportError:
                    tally.num_failed += 1
                    continue
                if retry_after_s:
                    await asyncio.sleep(min(retry_after_s, 0.5))

        tally.began = time.perf_counter()
        tasks = [asyncio.create_task(loop(f"Quiet {i}")) for i in range(args.quiet_streams)]
        await asyncio.sleep(args.duration_s)
        stop.set()
        await asyncio.gather(*tasks)
        tally.elapsed_s = time.perf_counter() - tally.began
    return tally


async def quiet_phase(args: argparse.Namespace) -> Tally:
    """The quiet tenant's phase in a process of its own (this module with ``--role quiet``)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.noisy_tenant_bench",
        "--role",
        "quiet",
        "--base-url",
        args.base_url,
        "--model",
        args.model,
        "--quiet-key",
        args.quiet_key,
        "--quiet-streams",
        str(args.quiet_streams),
        "--quiet-tokens",
        str(args.quiet_tokens),
        "--duration-s",
        str(args.duration_s),
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the quiet client exited with status {proc.returncode}")
    return Tally(**json.loads(out.decode().strip().splitlines()[-1]))


def gateway_view(lines: Iterable[str], request_ids: Iterable[str]) -> dict[str, list[float]]:
    """The telemetry figures (``TELEMETRY_FIELDS``) of the records whose request_id is one of
    ``request_ids``: one list per field, a record's None (no token came) left out. Lines that are not
    JSON (a record being written) are skipped; a request id recorded twice counts once (the first)."""
    wanted = set(request_ids)
    view: dict[str, list[float]] = {name: [] for name in TELEMETRY_FIELDS}
    for line in lines:
        match = _REQUEST_ID.search(line)  # cheap: only the wanted records are parsed
        if match is None or match.group(1) not in wanted:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        wanted.discard(match.group(1))
        for name in TELEMETRY_FIELDS:
            if isinstance(value := record.get(name), int | float):
                view[name].append(float(value))
    return view


def read_gateway_view(
    path: Path, request_ids: Sequence[str], timeout_s: float = 5.0
) -> dict[str, list[float]] | None:
    """``gateway_view`` of the telemetry file (and its newest rotated one), waiting up to ``timeout_s``
    for the writer thread to catch up with the last requests; None if there is no file."""
    deadline = time.monotonic() + timeout_s
    while True:
        files = [p for p in (path.with_name(path.name + ".1"), path) if p.exists()]
        if not files:
            return None
        lines = [line for p in files for line in p.read_text(errors="replace").splitlines()]
        view = gateway_view(lines, request_ids)
        if len(view["queue_ms"]) >= len(set(request_ids)) or time.monotonic() > deadline:
            return view
        time.sleep(0.25)


async def run(args: argparse.Namespace) -> tuple[list[str], dict[str, Any]]:
    """The report's lines, and the figures its plot is drawn from (``plots.noisy_tenant``)."""
    unloaded = await quiet_phase(args)
    limits = httpx.Limits(max_connections=args.flood_streams + 8)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=600, limits=limits) as client:
        flood = Tally()
        stop = asyncio.Event()
        began, cpu_began = time.perf_counter(), _cpu_s(resource.RUSAGE_SELF)
        flooders = [
            asyncio.create_task(flood_loop(client, args, f"Flood {i}", flood, stop))
            for i in range(args.flood_streams)
        ]
        await asyncio.sleep(args.warmup_s)
        flooded = await quiet_phase(args)
        stop.set()
        await asyncio.gather(*flooders)
        flood_s = time.perf_counter() - began
        flood_cpu_s = _cpu_s(resource.RUSAGE_SELF) - cpu_began
    itl_target_ms = float(os.environ.get("SLUICE_ITL_TARGET_MS", ITL_TARGET_MS))
    ttft_bound_ms = max(3 * pct(unloaded.ttft_ms, 95), 250.0)
    met = pct(flooded.ttft_ms, 95) < ttft_bound_ms and pct(flooded.gaps_ms, 95) < itl_target_ms
    views = [read_gateway_view(args.telemetry, t.request_ids) for t in (unloaded, flooded)]
    quiet, flooder = args.quiet_key.split("-")[1], args.flood_key.split("-")[1]
    figures = {
        "ttft_bound_ms": ttft_bound_ms,
        "num_streams": {quiet: args.quiet_streams, flooder: args.flood_streams},
        "phases": {
            "unloaded": {"ttft_at_s": unloaded.ttft_at_s, "ttft_ms": unloaded.ttft_ms,
                         "tokens_per_s": {quiet: unloaded.num_tokens / unloaded.elapsed_s, flooder: 0.0}},
            "during the flood": {"ttft_at_s": flooded.ttft_at_s, "ttft_ms": flooded.ttft_ms,
                                 "tokens_per_s": {quiet: flooded.num_tokens / flooded.elapsed_s,
                                                  flooder: flood.num_tokens / flood_s}},
        },
    }  # fmt: skip
    return [
        f"CPU: {cpu_description()}; flags: {cpu_flags()}. Flood: {args.flood_key.split('-')[1]} keeps "
        f"{args.flood_streams} streams of {args.flood_tokens} tokens going; quiet: "
        f"{args.quiet_key.split('-')[1]}, {args.quiet_streams} streams of {args.quiet_tokens} tokens for "
        f"{args.duration_s:.0f} s (after {args.warmup_s:.0f} s of flood), from a client process of its own; "
        f"{load_average()} at the end (other work on the same cores).",
        "",
        "| quiet tenant, as its client saw it | requests | failed | TTFT p50 ms | TTFT p95 ms | gap p50 ms "
        "| gap p95 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
        _row("unloaded", unloaded),
        _row("during the flood", flooded),
        "",
        f"Target: TTFT p95 under {ttft_bound_ms:.0f} ms, gap p95 under {itl_target_ms:.0f} ms: "
        f"**{'met' if met else 'not met'}**. During the flood: flooding tenant "
        f"{flood.num_tokens / flood_s:,.0f} output tokens/s ({flood.num_refused} streams refused with 429 "
        f"and retried, {flood.num_failed} failed), quiet tenant "
        f"{flooded.num_tokens / flooded.elapsed_s:,.0f} tokens/s. The flood client used "
        f"{flood_cpu_s:.1f} CPU-s in its {flood_s:.0f} s ({flood_cpu_s / flood_s:.0%} of a core).",
        "",
        *telemetry_lines(args.telemetry, views),
        "",
        f"![fairness under a noisy tenant]({PLOT.relative_to(REPO_ROOT / 'docs')})",
    ], figures


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def telemetry_lines(path: Path, views: Sequence[dict[str, list[float]] | None]) -> list[str]:
    """The table of the gateway's own figures for the quiet requests (unloaded, during the flood)."""
    if any(view is None for view in views):
        return [f"Gateway telemetry: no file at {path} (a gateway elsewhere, or telemetry off)."]
    rows = [
        "| quiet tenant, as the gateway saw it | records | TTFT p50 / p95 ms | queue p50 / p95 ms "
        "| replica TTFT p50 / p95 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, view in zip(("unloaded", "during the flood"), views, strict=True):
        assert view is not None
        cells = [f"{pct(view[n], 50):.0f} / {pct(view[n], 95):.0f}" for n in TELEMETRY_FIELDS]
        rows.append(f"| {label} | {len(view['queue_ms'])} | " + " | ".join(cells) + " |")
    return [
        *rows,
        "",
        f"From {path}, matched by X-Request-Id: TTFT from the gateway's auth guard to the first token, "
        "queue = in the gateway before the replica call, replica TTFT = from that call to its first token. "
        "The client's TTFT adds the connection, the HTTP layers and the client's own scheduling.",
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
    ap.add_argument("--telemetry", type=Path, default=Path(".sluice/telemetry.jsonl"), help="the gateway's")
    ap.add_argument("--role", choices=("main", "quiet"), default="main", help=argparse.SUPPRESS)
    ap.add_argument(
        "--write-docs", action="store_true", help="replace this bench's section of docs/benchmarks.md"
    )
    args = ap.parse_args()
    if args.role == "quiet":
        print(json.dumps(asdict(asyncio.run(quiet_role(args)))))
        return
    lines, figures = asyncio.run(run(args))
    print("\n".join(lines))
    if args.write_docs:
        plots.save_json(PLOT, figures)
        plots.noisy_tenant(figures["phases"], PLOT, figures["ttft_bound_ms"])
        command = (
            f"python -m bench.noisy_tenant_bench --flood-streams {args.flood_streams} "
            f"--flood-tokens {args.flood_tokens} --quiet-streams {args.quiet_streams} "
            f"--duration-s {args.duration_s:.0f}"
        )
        write_measured("noisy-tenant", f"{command} --write-docs", lines)


if __name__ == "__main__":
    main()
