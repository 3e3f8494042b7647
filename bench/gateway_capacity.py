"""One gateway process's capacity: the most concurrent streams at 25 tok/s it carries on one core with
added inter-token p99 under 5 ms, and its CPU per streamed token, against a FAKE replica.

The fake (bench/fake_replica.py) is a Triton-protocol gRPC server with no engine: one token per 40 ms per
request (``--interval-ms``), ``--tokens-per-message`` to a response, with the CPU engine model's output
tensors. The gateway (``python -m gateway``, static routing to the fake, a tenant of its own with safety
policy none and no quota, in a state directory of its own: .sluice/bench/capacity) is pinned to one core
(``--gateway-cpu``, default 0) with ``taskset``; the fake and this process's load client share the
others (``--load-cpus``, default 1). The client is a minimal HTTP/1.1 client (an asyncio protocol per
keep-alive connection that counts SSE events as they arrive), closed loop: each connection streams
``--max-tokens``-token completions back to back, the connections' starts spread over a ramp so their
tokens are not in phase.

At each stream count the run ramps up, settles, then measures over ``--window-s``:

- the gateway's CPU (utime + stime from /proc) per token and per message the fake sent;
- the gaps between a stream's consecutive events at the client: their p99 minus the fake's own message
  period is the added inter-token p99 (the fake's timer lateness, which is in that figure too, is
  reported beside it);
- the tokens/s delivered against the streams x 25 offered, and the load side's CPU (fake + client): a
  load side near a full core cannot offer more, and then the stream count is the load side's limit, not
  the gateway's.

A stream count passes when added p99 < ``--max-added-p99-ms`` (5), at least 97% of the offered tokens
arrive and no request failed. The sweep doubles from ``--start`` while it passes, then bisects twice.
Then the largest passing count runs twice more, to split the gateway's CPU into per message, per token
and per request (``per_message_token_request_us``): with ``--split-tokens-per-message`` tokens in each of
the fake's messages at the same message rate (requests as many times longer), and with requests a
quarter as long.

    flock /tmp/sluice-bench.lock .venv/bin/python -m bench.gateway_capacity            # sweep, ~3 min
    flock /tmp/sluice-bench.lock .venv/bin/python -m bench.gateway_capacity --streams 200 --window-s 10
    ... --write-docs   # the "gateway-capacity" section of docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import numpy as np

from bench import fake_replica
from bench.cpu_split import CLOCK_TICKS_PER_S, process_cpu_s
from bench.report import cpu_description, cpu_flags, load_average, pct, write_section
from bench.servers import REPO_ROOT, StackPorts, http_ok, log
from sluice.domain import Tenant

STATE_DIR = REPO_ROOT / ".sluice" / "bench" / "capacity"
TENANT, API_KEY = "bench-capacity", "sk-bench-capacity"
MODEL = "sluice-tiny"
# Counted per event: one completion chunk with text (the finish and usage chunks carry a finish reason).
EVENT_MARK = b'"finish_reason":null'
DONE_MARK = b"data: [DONE]"


def user_system_s(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` so far (0, 0 if it is gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[11]) / CLOCK_TICKS_PER_S, int(fields[12]) / CLOCK_TICKS_PER_S


# ----- the load client -----
@dataclass
class LoadStats:
    events: int = 0
    requests_done: int = 0
    errors: int = 0
    measuring: bool = False


class StreamConnection(asyncio.Protocol):
    """One keep-alive connection streaming completions back to back; counts text events as they arrive
    and, while measuring, the gap since the stream's previous event (the first event of a request is not
    a gap: it is time to first token)."""

    def __init__(self, request: bytes, stats: LoadStats, gaps: list[float]) -> None:
        self.request = request
        self.stats = stats
        self.gaps = gaps
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.stopping = False
        self._reset()

    def _reset(self) -> None:
        self._head = b""
        self._in_body = False
        self._tail = b""
        self._done_seen = False
        self._last_event_s: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.stopping:
            self.stats.errors += 1
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            status = self._head[9:12]
            data, self._head = self._head[end + 4 :], b""
            if status != b"200":
                self.stats.errors += 1
                assert self.transport is not None
                self.transport.close()  # simplest: a fresh connection is opened by the driver
                return
            self._in_body = True
        now = time.monotonic()
        chunk = self._tail + data
        count = chunk.count(EVENT_MARK)
        if count:
            self.stats.events += count
            if self._last_event_s is not None and self.stats.measuring:
                self.gaps.append(now - self._last_event_s)
                self.gaps.extend([0.0] * (count - 1))
            self._last_event_s = now
        if not self._done_seen and DONE_MARK in chunk:
            self._done_seen = True
        if self._done_seen and chunk.endswith(b"0\r\n\r\n"):
            self.stats.requests_done += 1
            self._reset()
            if not self.stopping and self.transport is not None:
                self.transport.write(self.request)
            return
        self._tail = chunk[-32:]

    def stop(self) -> None:
        self.stopping = True
        if self.transport is not None:
            self.transport.abort()


def completion_request(port: int, prompt: list[int], max_tokens: int) -> bytes:
    body = json.dumps(
        {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


# ----- one stream count -----
@dataclass(frozen=True)
class LevelResult:
    streams: int
    wall_s: float
    tokens: int
    messages: int
    requests: int  # streams the fake began in the window
    offered_tokens_per_s: float
    gateway_cpu_s: float
    gateway_system_s: float
    fake_cpu_s: float
    client_cpu_s: float
    gap_p50_ms: float
    gap_p99_ms: float
    period_ms: float
    fake_late_p99_ms: float
    errors: int
    tokens_per_message: int = 1

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def us_per_token(self) -> float:
        return self.gateway_cpu_s * 1e6 / self.tokens if self.tokens else float("nan")

    @property
    def us_per_message(self) -> float:
        return self.gateway_cpu_s * 1e6 / self.messages if self.messages else float("nan")

    @property
    def system_share(self) -> float:
        return self.gateway_system_s / self.gateway_cpu_s if self.gateway_cpu_s else 0.0

    @property
    def gateway_cores(self) -> float:
        return self.gateway_cpu_s / self.wall_s

    @property
    def load_side_cores(self) -> float:
        return (self.fake_cpu_s + self.client_cpu_s) / self.wall_s

    @property
    def added_p99_ms(self) -> float:
        return self.gap_p99_ms - self.period_ms

    @property
    def delivered_share(self) -> float:
        return self.tokens_per_s / self.offered_tokens_per_s

    def passes(self, max_added_p99_ms: float) -> bool:
        return self.added_p99_ms < max_added_p99_ms and self.delivered_share >= 0.97 and self.errors == 0

    def line(self) -> str:
        return (
            f"{self.streams:5d} streams: {self.tokens_per_s:7.0f} tok/s ({self.delivered_share:4.0%} of "
            f"offered), gateway {self.gateway_cores:4.2f} core, {self.us_per_token:5.1f} µs/token, "
            f"{self.us_per_message:5.1f} µs/message ({self.system_share:.0%} system); gap p50 "
            f"{self.gap_p50_ms:5.1f} p99 {self.gap_p99_ms:5.1f} "
            f"ms (added {self.added_p99_ms:+5.1f}; fake timer late p99 {self.fake_late_p99_ms:.1f}); load "
            f"side {self.load_side_cores:4.2f} core (fake {self.fake_cpu_s / self.wall_s:.2f}, client "
            f"{self.client_cpu_s / self.wall_s:.2f}); errors {self.errors}"
        )


async def run_level(
    streams: int,
    *,
    port: int,
    gateway_pid: int,
    fake_pid: int,
    stats_shm: fake_replica.FakeStats,
    request: bytes,
    period_s: float,
    interval_s: float,
    window_s: float,
    settle_s: float,
    profile: Path | None = None,
    tokens_per_message: int = 1,
) -> LevelResult:
    loop = asyncio.get_running_loop()
    stats, gaps = LoadStats(), list[float]()
    conns: list[StreamConnection] = []
    ramp_s = max(2.0, streams / 400)

    async def open_one(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        _, conn = await loop.create_connection(
            lambda: StreamConnection(request, stats, gaps), "127.0.0.1", port
        )
        conns.append(conn)

    await asyncio.gather(*(open_one(i * ramp_s / streams) for i in range(streams)))
    await asyncio.sleep(settle_s)
    counters0, late0 = stats_shm.snapshot()
    gw0, fake0 = process_cpu_s(gateway_pid) or 0.0, process_cpu_s(fake_pid) or 0.0
    sys0 = user_system_s(gateway_pid)[1]
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    errors0 = stats.errors
    began = time.monotonic()
    stats.measuring = True
    spy = None
    if profile is not None:  # py-spy (not a dependency: pip install py-spy), on the load side's cores
        py_spy = Path(sys.executable).with_name("py-spy")
        spy = subprocess.Popen(
            [str(py_spy), "record", *os.environ.get("PY_SPY_ARGS", "--nonblocking").split(), "-r", "250",
             "-f", "raw", "-o", str(profile), "-d", str(int(window_s)), "-p", str(gateway_pid)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    await asyncio.sleep(window_s)
    stats.measuring = False
    wall_s = time.monotonic() - began
    counters1, late1 = stats_shm.snapshot()
    gw1, fake1 = process_cpu_s(gateway_pid) or 0.0, process_cpu_s(fake_pid) or 0.0
    sys1 = user_system_s(gateway_pid)[1]
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    client_cpu = (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime)
    errors = stats.errors - errors0
    if spy is not None:
        await asyncio.to_thread(spy.wait)
    for conn in conns:
        conn.stop()
    await asyncio.gather(*(c.closed for c in conns))
    gap_values = [g * 1000 for g in gaps]
    return LevelResult(
        streams=streams,
        wall_s=wall_s,
        tokens=counters1[fake_replica.FakeStats.TOKENS] - counters0[fake_replica.FakeStats.TOKENS],
        messages=counters1[fake_replica.FakeStats.MESSAGES] - counters0[fake_replica.FakeStats.MESSAGES],
        requests=counters1[fake_replica.FakeStats.STREAMS] - counters0[fake_replica.FakeStats.STREAMS],
        offered_tokens_per_s=streams / interval_s,
        gateway_cpu_s=gw1 - gw0,
        gateway_system_s=sys1 - sys0,
        fake_cpu_s=fake1 - fake0,
        client_cpu_s=client_cpu,
        gap_p50_ms=pct(gap_values, 50),
        gap_p99_ms=pct(gap_values, 99),
        period_ms=period_s * 1000,
        fake_late_p99_ms=fake_replica.late_percentile_us(late0, late1, 99) / 1000,
        errors=errors,
        tokens_per_message=tokens_per_message,
    )


async def wait_streams_ended(stats_shm: fake_replica.FakeStats, timeout_s: float = 10.0) -> None:
    """Until the fake holds no stream (the gateway cancelled what the closed connections left)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        c = list(stats_shm.counters)
        S = fake_replica.FakeStats
        if c[S.STREAMS] - c[S.ENDED] - c[S.CANCELLED] <= 0:
            return
        await asyncio.sleep(0.2)


# ----- the servers -----
def prepare_state(checkpoint_dir: Path) -> None:
    """The bench's tenant (safety none, no quota) in its own state directory's store."""
    from sluice.settings import Settings
    from sluice.stores.openers import open_tenant_store

    STATE_DIR.mkdir(parents=True, exist_ok=True)

    async def put() -> None:
        store = await open_tenant_store(Settings(state_dir=STATE_DIR, checkpoint_dir=checkpoint_dir))
        try:
            await store.put_tenant(Tenant(tenant_id=TENANT, name="Capacity bench", safety_policy="none"))
            await store.add_key(TENANT, API_KEY)
        finally:
            await store.close()

    asyncio.run(put())


def gateway_env(port: int, fake_port: int, checkpoint_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SLUICE_STATE_DIR": str(STATE_DIR),
        "SLUICE_CHECKPOINT_DIR": str(checkpoint_dir),
        "SLUICE_MODEL_NAME": MODEL,
        "SLUICE_ROUTING": "static",
        "SLUICE_ENGINE_CLIENT": "triton",
        "SLUICE_TRITON_GRPC_URL": f"127.0.0.1:{fake_port}",
        "SLUICE_TRITON_METRICS_URL": f"http://127.0.0.1:{fake_port}/no-metrics",  # no load reads
        "SLUICE_GATEWAY_PORT": str(port),
        "SLUICE_DEV_TENANTS": "false",
        "SLUICE_MAX_CONNECTIONS": "20000",
        # The fake's cadence is the replica's ITL: keep the dispatch gate open, whatever the gaps.
        "SLUICE_ITL_TARGET_MS": "10000",
        "SLUICE_MAX_WAITING_PER_REPLICA": "10000",
        "SLUICE_REQUEST_DEADLINE_S": "600",
        "SLUICE_MAX_OUTPUT_TOKENS": "100000",  # the split's longer requests
        "SLUICE_BATCH_RUNNER": "false",
    }


@dataclass
class Servers:
    gateway: subprocess.Popen[bytes]
    fake: BaseProcess
    fake_pid: int
    log_path: Path


def start_servers(
    args: argparse.Namespace, port: int, fake_port: int, stats_shm: fake_replica.FakeStats
) -> Servers:
    config = fake_replica.FakeConfig(args.interval_ms / 1000, args.tokens_per_message, tuple(args.token_ids))
    fake = fake_replica.start_process(fake_port, config, stats_shm, set(args.load_cpus))
    log_path = STATE_DIR / "gateway.log"
    env = gateway_env(port, fake_port, args.checkpoint_dir)
    root = args.gateway_root.resolve()
    if root != REPO_ROOT:  # another tree's gateway (e.g. `git archive <commit>` unpacked), for an A/B
        env["PYTHONPATH"] = str(root)
    command = ["taskset", "-c", str(args.gateway_cpu), sys.executable, "-m", "gateway"]
    with log_path.open("wb") as out:
        gateway = subprocess.Popen(
            command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 60
    while not http_ok(f"http://127.0.0.1:{port}/readyz"):
        if gateway.poll() is not None or time.monotonic() > deadline:
            gateway.kill()
            fake.terminate()
            raise RuntimeError(f"the gateway did not become ready; see {log_path}")
        time.sleep(0.3)
    return Servers(gateway, fake, fake.pid or 0, log_path)


def stop_servers(servers: Servers) -> None:
    if servers.gateway.poll() is None:
        servers.gateway.send_signal(signal.SIGTERM)
        try:
            servers.gateway.wait(15)
        except subprocess.TimeoutExpired:
            servers.gateway.kill()
            servers.gateway.wait()
    fake = servers.fake
    fake.terminate()
    fake.join(5)
    if fake.is_alive():
        fake.kill()


def word_token_ids(checkpoint_dir: Path) -> list[int]:
    """Ids of whole words (one token each) of the checkpoint's tokenizer: the fake's text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(checkpoint_dir / "tokenizer.json"))
    text = "the quick brown fox jumps over a lazy dog while seven small birds sing in the warm light"
    words = text.split()
    ids = []
    for word in words:
        encoded = tok.encode(" " + word, add_special_tokens=False).ids
        if len(encoded) == 1:
            ids.append(encoded[0])
    return ids or list(fake_replica.DEFAULT_TOKEN_IDS)


# ----- the sweep -----
def sweep_counts(start: int, passes: dict[int, bool], max_streams: int, bisections: int = 2) -> int | None:
    """The next stream count to try: doubling from ``start`` while every count passes, then
    ``bisections`` bisections between the largest pass and the smallest failure; None when done."""
    doubling = {min(start * 2**i, max_streams) for i in range(32)}
    if not passes:
        return start
    passed = [n for n, ok in passes.items() if ok]
    failed = [n for n, ok in passes.items() if not ok]
    if not failed:
        top = max(passed)
        return min(top * 2, max_streams) if top < max_streams else None
    low, high = max(passed, default=0), min(failed)
    mid = (low + high) // 2
    if sum(1 for n in passes if n not in doubling) >= bisections or high - low <= max(10, high // 20):
        return None
    return mid


def docs_section(
    args: argparse.Namespace,
    results: list[LevelResult],
    split: tuple[LevelResult, LevelResult, LevelResult] | None,
    command: str,
) -> str:
    best = max((r for r in results if r.passes(args.max_added_p99_ms)), key=lambda r: r.streams, default=None)
    lines = [
        f"```\n{command}\n```",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {cpu_description()} (flags: {cpu_flags()}); "
        f"{args.load_before} before the run. One gateway process (`python -m gateway`, static routing, a "
        f"tenant with safety policy none) pinned to CPU {args.gateway_cpu}; a FAKE replica "
        f"(bench/fake_replica.py: Triton's gRPC protocol, no engine, one token per {args.interval_ms:g} ms "
        f"per request, {args.tokens_per_message} token(s) per message) and the load client (closed loop, "
        f"{args.max_tokens}-token completions over keep-alive connections) on CPU(s) "
        f"{','.join(map(str, args.load_cpus))}. Each stream count: {args.window_s:g} s measured after the "
        "ramp. Gateway CPU from /proc per token and per message the fake sent; added p99 = the client's "
        "p99 gap between a stream's events minus the fake's message period (the fake's own timer lateness "
        "is in it, and shown).",
        "",
        "| streams | tok/s | of offered | gateway cores | µs/token | µs/message | gap p50 ms | gap p99 ms "
        "| added p99 ms | fake late p99 ms | load side cores | pass |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]

    def row(r: LevelResult, streams: str) -> str:
        return (
            f"| {streams} | {r.tokens_per_s:.0f} | {r.delivered_share:.0%} | {r.gateway_cores:.2f} | "
            f"{r.us_per_token:.1f} | {r.us_per_message:.1f} | {r.gap_p50_ms:.1f} | {r.gap_p99_ms:.1f} | "
            f"{r.added_p99_ms:+.1f} | {r.fake_late_p99_ms:.1f} | {r.load_side_cores:.2f} | "
            f"{'yes' if r.passes(args.max_added_p99_ms) else 'no'} |"
        )

    lines.extend(row(r, str(r.streams)) for r in sorted(results, key=lambda r: r.streams))
    if split is not None:
        k = split[1].tokens_per_message
        lines.append(row(split[1], f"{split[1].streams}, {k} tokens a message"))
        lines.append(row(split[2], f"{split[2].streams}, requests 1/4 as long"))
    lines.append("")
    if split is not None:
        per_message, per_token, per_request = per_message_token_request_us(split)
        lines.append(
            f"Per message, token and request (the largest passing count three ways: as swept; {k} tokens in "
            f"each message at the same message rate and requests {k}x as long; requests "
            f"{max(1, args.max_tokens // 4)} tokens long): about **{per_message:.0f} µs of gateway CPU per "
            f"message** (the gRPC receive, the engine client, the per-delta work, one SSE write), "
            f"**{per_token:.1f} µs per token** beyond it, and **{per_request / 1000:.1f} ms per request** "
            f"(admission, dispatch, usage and telemetry records, the HTTP exchange). So a stream of n tokens "
            f"sent k to a message costs the gateway about {per_message:.0f} n / k + {per_token:.1f} n + "
            f"{per_request:.0f} µs."
        )
        lines.append("")
    if best is None:
        lines.append("No stream count passed.")
    else:
        lines.append(
            f"Largest passing count: **{best.streams} streams** ({best.tokens_per_s:.0f} tok/s) at "
            f"**{best.us_per_token:.1f} µs of gateway CPU per token** ({best.us_per_message:.1f} per "
            f"message), {best.gateway_cores:.2f} of its core busy."
        )
        if best.load_side_cores > 0.85:
            lines.append(
                f"The load side (fake + client) used {best.load_side_cores:.2f} of its core there: the "
                "count is where the load side stops, not necessarily the gateway. The gateway's core "
                f"would carry about {best.streams / max(best.gateway_cores, 1e-9):.0f} streams at this "
                "CPU per token if fully busy (an extrapolation, not a measurement)."
            )
    return "\n".join(lines)


async def sweep(
    args: argparse.Namespace, servers: Servers, port: int, stats_shm: fake_replica.FakeStats
) -> tuple[list[LevelResult], tuple[LevelResult, LevelResult, LevelResult] | None]:
    """The stream counts' results, and the pair (1 token a message, ``--split-tokens-per-message``) at the
    largest passing count that splits the gateway's CPU into per-message and per-token parts."""
    requests = {
        k: completion_request(port, args.prompt_ids, args.max_tokens * k)
        for k in {1, max(1, args.split_tokens_per_message)}
    }
    shorter = completion_request(port, args.prompt_ids, max(1, args.max_tokens // 4))
    period_s = args.interval_ms / 1000 * args.tokens_per_message
    results: dict[int, LevelResult] = {}
    explicit = list(args.streams or [])

    async def one(
        n: int, profile: Path | None = None, tokens_per_message: int = 0, short: bool = False
    ) -> LevelResult:
        """``n`` streams; ``tokens_per_message``: that many tokens in each of the fake's messages, at the
        same message period (and requests as many times longer, so requests/s stay the same too)."""
        await wait_streams_ended(stats_shm)
        stats_shm.counters[fake_replica.FakeStats.TOKENS_PER_MESSAGE] = tokens_per_message
        k = tokens_per_message or args.tokens_per_message
        result = await run_level(
            n,
            port=port,
            gateway_pid=servers.gateway.pid,
            fake_pid=servers.fake_pid,
            stats_shm=stats_shm,
            request=shorter if short else requests[tokens_per_message or 1],
            period_s=period_s,
            interval_s=period_s / k,
            window_s=args.window_s,
            settle_s=args.settle_s,
            profile=profile,
            tokens_per_message=k,
        )
        stats_shm.counters[fake_replica.FakeStats.TOKENS_PER_MESSAGE] = 0
        log(result.line())
        return result

    # A short warm-up (imports, first requests) that is not reported.
    await one(min(50, args.start))
    if explicit:
        for i, n in enumerate(explicit):
            results[n] = await one(n, args.profile if i == len(explicit) - 1 else None)
    else:
        passes: dict[int, bool] = {}
        while (n := sweep_counts(args.start, passes, args.max_streams)) is not None:
            results[n] = await one(n)
            passes[n] = results[n].passes(args.max_added_p99_ms)
    passing = [r for r in results.values() if r.passes(args.max_added_p99_ms)] or list(results.values())
    split = None
    if args.split_tokens_per_message > 1 and passing:
        base = max(passing, key=lambda r: r.streams)
        several = await one(base.streams, tokens_per_message=args.split_tokens_per_message)
        split = (base, several, await one(base.streams, short=True))
    return list(results.values()), split


def per_message_token_request_us(runs: Sequence[LevelResult]) -> tuple[float, float, float]:
    """(µs per message, per token, per request) solving cpu = a x messages + b x tokens + r x requests
    over three runs at the same streams: one token a message, several at the same message rate, and one
    token a message in requests a quarter as long (the same messages, four times the requests)."""
    matrix = np.array([[r.messages, r.tokens, r.requests] for r in runs], dtype=float)
    cpu_us = np.array([r.gateway_cpu_s * 1e6 for r in runs])
    try:
        a, b, r = np.linalg.solve(matrix, cpu_us)
    except np.linalg.LinAlgError:
        return float("nan"), float("nan"), float("nan")
    return float(a), float(b), float(r)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="*", help="these stream counts (default: the sweep)")
    ap.add_argument("--start", type=int, default=100)
    ap.add_argument("--max-streams", type=int, default=4000)
    ap.add_argument("--interval-ms", type=float, default=40.0, help="the fake's per-token cadence")
    ap.add_argument("--tokens-per-message", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--window-s", type=float, default=12.0)
    ap.add_argument("--settle-s", type=float, default=3.0)
    ap.add_argument("--max-added-p99-ms", type=float, default=5.0)
    ap.add_argument(
        "--split-tokens-per-message",
        type=int,
        default=4,
        help="after the sweep, the largest passing count again at this many tokens a message (0: not)",
    )
    ap.add_argument("--gateway-cpu", type=int, default=0)
    ap.add_argument("--load-cpus", type=int, nargs="+", default=[1])
    ap.add_argument("--checkpoint-dir", type=Path, default=REPO_ROOT / ".sluice" / "models" / MODEL)
    ap.add_argument(
        "--gateway-root",
        type=Path,
        default=REPO_ROOT,
        help="run the gateway from this source tree (e.g. `git archive COMMIT | tar -x -C DIR`), for an A/B",
    )
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument(
        "--profile",
        type=Path,
        help="py-spy's raw (collapsed) stacks of the gateway over the last --streams' window",
    )
    args = ap.parse_args(argv)
    args.checkpoint_dir = args.checkpoint_dir.resolve()
    args.token_ids = word_token_ids(args.checkpoint_dir)
    args.prompt_ids = (args.token_ids * (args.prompt_tokens // len(args.token_ids) + 1))[: args.prompt_tokens]
    os.sched_setaffinity(0, set(args.load_cpus))
    args.load_before = load_average()
    prepare_state(args.checkpoint_dir)
    port, fake_port = StackPorts.free().gateway, StackPorts.free().triton_grpc
    stats_shm = fake_replica.FakeStats()
    command = "flock /tmp/sluice-bench.lock .venv/bin/python -m bench.gateway_capacity " + shlex.join(
        a for a in (argv if argv is not None else sys.argv[1:]) if a != "--write-docs"
    )
    servers = start_servers(args, port, fake_port, stats_shm)
    log(f"gateway on CPU {args.gateway_cpu} (pid {servers.gateway.pid}), fake replica pid {servers.fake_pid}")
    try:
        results, split = asyncio.run(sweep(args, servers, port, stats_shm))
    finally:
        stop_servers(servers)
    if args.write_docs:
        write_section("gateway-capacity", docs_section(args, results, split, command.rstrip()))
        log("wrote the gateway-capacity section of docs/benchmarks.md")
    else:
        print(docs_section(args, results, split, command.rstrip()))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
