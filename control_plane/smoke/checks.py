"""The five requests of the first-GPU-node check, sent through any OpenAI-compatible gateway with the
official ``openai`` client, one after another, each judged pass or fail:

- ``greedy``: temperature 0 streams text and ends with ``stop`` or ``length``;
- ``sampled``: temperature 0.8, top_p 0.95 and a seed do the same;
- ``stop-word``: the greedy request again with a stop string taken from its own output (greedy is
  deterministic): the text must end just before it, with ``stop``;
- ``cancelled``: a long stream closed after its first chunk; the gateway must count it cancelled and
  hold it no more (its ``/metrics``), and the replica must drop it (the engine's active requests in
  Triton's metrics, when a replica metrics URL is given and carries them);
- ``too-long``: a prompt of more tokens than the engine's ``max_input_len`` must be refused with 400
  ``context_length_exceeded`` (TensorRT-LLM's executor would answer INTERNAL).

Each result carries the TTFT and the decode tokens/s it saw: TTFT is the gateway's ``Server-Timing``
(time in the gateway + the replica's time to first token) when the gateway sends one, else the time to
the first streamed text; tokens/s is (output tokens - 1) over the time from that first token to the end
of the stream (the safety screen's holdback delays what the client sees, not when tokens were made).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import openai
from openai import OpenAI

from control_plane.metrics_text import Metrics
from sluice.triton.metrics import replica_stats_from_metrics

PROMPT = "Write one line about rivers."
NUM_GREEDY_TOKENS = 48
CANCEL_WAIT_S = 10.0  # how long the gateway and the replica have to let go of a cancelled request
_SERVER_TIMING = re.compile(r"([\w-]+);dur=([0-9.]+)")


@dataclass(frozen=True)
class SmokeTarget:
    """Where the checks send their requests."""

    base_url: str  # the gateway's OpenAI base URL, e.g. http://127.0.0.1:8080/v1
    api_key: str
    model: str
    max_input_len: int  # the engine's longest prompt, in tokens (the too-long request sends more)
    cancel_max_tokens: int = 512  # the cancelled request's max_tokens: long enough to be cut mid-way
    replica_metrics_url: str | None = None  # Triton's /metrics, for the engine's active requests
    timeout_s: float = 120.0

    @property
    def gateway_metrics_url(self) -> str:
        return self.base_url.rstrip("/").removesuffix("/v1") + "/metrics"


@dataclass(frozen=True)
class CheckResult:
    name: str
    passed: bool
    detail: str  # what was seen, one line
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    num_output_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Streamed:
    text: str
    finish_reason: str | None
    num_output_tokens: int
    ttft_ms: float | None
    tokens_per_s: float | None


def run_checks(target: SmokeTarget) -> list[CheckResult]:
    """Every check, in order; one that raises is a failed check with the error as its detail."""
    client = OpenAI(base_url=target.base_url, api_key=target.api_key, timeout=target.timeout_s, max_retries=0)
    greedy_text: list[str] = []  # the stop-word check's source text, once greedy has run
    checks: list[tuple[str, Callable[[], CheckResult]]] = [
        ("greedy", lambda: _greedy(client, target, greedy_text)),
        ("sampled", lambda: _sampled(client, target)),
        ("stop-word", lambda: _stop_word(client, target, greedy_text)),
        ("cancelled", lambda: _cancelled(client, target)),
        ("too-long", lambda: _too_long(client, target)),
    ]
    results = []
    for name, check in checks:
        try:
            results.append(check())
        except (openai.OpenAIError, httpx.HTTPError, OSError, ValueError) as exc:
            results.append(CheckResult(name, False, f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
    return results


def _stream(client: OpenAI, target: SmokeTarget, **params: Any) -> _Streamed:
    start = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=target.model,
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        stream_options={"include_usage": True},
        **params,
    )
    parts: list[str] = []
    finish, num_tokens, first_s = None, 0, None
    with raw.parse() as stream:
        for chunk in stream:
            if chunk.usage is not None:
                num_tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.delta.content:
                    first_s = first_s or time.perf_counter() - start
                    parts.append(choice.delta.content)
                finish = choice.finish_reason or finish
    end_s = time.perf_counter() - start
    ttft_ms = _server_ttft_ms(raw.headers.get("server-timing", "")) or (first_s and first_s * 1000)
    rate = None
    if ttft_ms is not None and num_tokens > 1 and end_s > ttft_ms / 1000:
        rate = (num_tokens - 1) / (end_s - ttft_ms / 1000)
    return _Streamed("".join(parts), finish, num_tokens, ttft_ms, rate)


def _server_ttft_ms(header: str) -> float | None:
    """gateway + replica-ttft from a Sluice gateway's Server-Timing header; None without them."""
    parts = {name: float(value) for name, value in _SERVER_TIMING.findall(header)}
    if "gateway" not in parts or "replica-ttft" not in parts:
        return None
    return parts["gateway"] + parts["replica-ttft"]


def _judged(name: str, streamed: _Streamed, problem: str | None, detail: str) -> CheckResult:
    return CheckResult(
        name,
        problem is None,
        problem or detail,
        streamed.ttft_ms,
        streamed.tokens_per_s,
        streamed.num_output_tokens,
    )


def _ended_well(streamed: _Streamed) -> str | None:
    if streamed.num_output_tokens < 1:
        return f"no output tokens (finish_reason {streamed.finish_reason!r})"
    if streamed.finish_reason not in ("stop", "length"):
        return f"finish_reason {streamed.finish_reason!r}, not stop or length"
    return None


def _greedy(client: OpenAI, target: SmokeTarget, greedy_text: list[str]) -> CheckResult:
    streamed = _stream(client, target, temperature=0, max_tokens=NUM_GREEDY_TOKENS)
    greedy_text.append(streamed.text)
    detail = f"{streamed.num_output_tokens} tokens, {streamed.finish_reason}: {streamed.text[:40]!r}"
    return _judged("greedy", streamed, _ended_well(streamed), detail)


def _sampled(client: OpenAI, target: SmokeTarget) -> CheckResult:
    streamed = _stream(client, target, temperature=0.8, top_p=0.95, seed=1234, max_tokens=NUM_GREEDY_TOKENS)
    detail = f"{streamed.num_output_tokens} tokens, {streamed.finish_reason}: {streamed.text[:40]!r}"
    return _judged("sampled", streamed, _ended_well(streamed), detail)


def stop_string_in(text: str, length: int = 3) -> tuple[str, str] | None:
    """A stop string from ``text`` and the text a stream stopped by it must return: ``length``
    characters, not all whitespace, first found after at least one character; None if there is none."""
    for start in range(1, len(text) - length + 1):
        stop = text[start : start + length]
        if stop.strip() and text.find(stop) == start:
            return stop, text[:start]
    return None


def _stop_word(client: OpenAI, target: SmokeTarget, greedy_text: list[str]) -> CheckResult:
    chosen = stop_string_in(greedy_text[0]) if greedy_text else None
    if chosen is None:
        return CheckResult("stop-word", False, "the greedy output has no text to take a stop string from")
    stop, expected = chosen
    streamed = _stream(client, target, temperature=0, max_tokens=NUM_GREEDY_TOKENS, stop=[stop])
    problem = None
    if streamed.finish_reason != "stop":
        problem = f"finish_reason {streamed.finish_reason!r} with stop {stop!r}, not stop"
    elif streamed.text != expected:
        problem = f"text {streamed.text!r} with stop {stop!r}, expected {expected!r}"
    return _judged("stop-word", streamed, problem, f"stopped before {stop!r} after {expected!r}")


def _cancelled(client: OpenAI, target: SmokeTarget) -> CheckResult:
    before = _gateway_cancellations(target)
    start = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=target.model,
        messages=[{"role": "user", "content": PROMPT}],
        stream=True,
        temperature=0.8,
        max_tokens=target.cancel_max_tokens,
    )
    with raw.parse() as stream:
        first = next(iter(stream), None)
        first_ms = (time.perf_counter() - start) * 1000
        if first is None or any(c.finish_reason for c in first.choices):
            return CheckResult("cancelled", False, "the stream ended before it could be cancelled")
    # Leaving the `with` closed the connection: the gateway sees the client go.
    seen = _wait_released(target, before)
    ttft_ms = _server_ttft_ms(raw.headers.get("server-timing", "")) or first_ms
    return CheckResult("cancelled", seen[0], seen[1], ttft_ms)


def _wait_released(target: SmokeTarget, before: float | None) -> tuple[bool, str]:
    """Whether the gateway (and the replica, where its metrics say) let go of the cancelled request
    within ``CANCEL_WAIT_S``, and what was seen."""
    deadline = time.monotonic() + CANCEL_WAIT_S
    while True:
        after, in_flight = _gateway_cancellations(target), _gateway_in_flight(target)
        replica = _replica_active(target)
        gateway_done = before is None or (after is not None and after > before and in_flight == 0)
        if gateway_done and (replica is None or replica == 0):
            break
        if time.monotonic() > deadline:
            return False, (
                f"after {CANCEL_WAIT_S:.0f} s: gateway cancellations {before} -> {after}, in flight "
                f"{in_flight}; replica active requests {replica}"
            )
        time.sleep(0.1)
    gateway = "gateway counted it cancelled" if before is not None else "gateway has no Sluice metrics"
    held = "replica holds none" if replica is not None else "replica metrics carry no active requests"
    return True, f"closed after the first chunk; {gateway}; {held}"


def _metrics_text(url: str | None) -> str | None:
    if url is None:
        return None
    try:
        response = httpx.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def _gateway_metrics(target: SmokeTarget) -> Metrics | None:
    """The gateway's metrics; None when it exports none of Sluice's (another OpenAI-compatible server)."""
    text = _metrics_text(target.gateway_metrics_url)
    try:
        metrics = Metrics.parse(text) if text is not None else None
    except ValueError:
        return None
    return metrics if metrics and metrics.total("sluice_gateway_requests_in_flight") is not None else None


def _gateway_cancellations(target: SmokeTarget) -> float | None:
    metrics = _gateway_metrics(target)
    return None if metrics is None else metrics.total("sluice_gateway_cancellations_total") or 0.0


def _gateway_in_flight(target: SmokeTarget) -> float | None:
    metrics = _gateway_metrics(target)
    return None if metrics is None else metrics.total("sluice_gateway_requests_in_flight")


def _replica_active(target: SmokeTarget) -> int | None:
    text = _metrics_text(target.replica_metrics_url)
    stats = replica_stats_from_metrics(text, target.model) if text is not None else None
    return None if stats is None else stats.num_running + stats.num_waiting


def _too_long(client: OpenAI, target: SmokeTarget) -> CheckResult:
    # NOTE: whitespace-separated words: every tokenizer makes at least one token of each.
    words = " ".join(["the"] * (target.max_input_len + 1))
    try:
        client.chat.completions.create(
            model=target.model, messages=[{"role": "user", "content": words}], max_tokens=1
        )
    except openai.BadRequestError as exc:
        code = exc.code or ""
        if code == "context_length_exceeded":
            message = exc.body.get("message", "") if isinstance(exc.body, dict) else exc.message
            return CheckResult("too-long", True, f"400 {code}: {' '.join(str(message).split())[:120]}")
        return CheckResult("too-long", False, f"400 with code {code!r}, not context_length_exceeded")
    except openai.APIStatusError as exc:
        return CheckResult("too-long", False, f"{exc.status_code} instead of 400 context_length_exceeded")
    return CheckResult("too-long", False, f"a {target.max_input_len + 1}-word prompt was served, not refused")
