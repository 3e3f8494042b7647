"""The gateway's per-message work, part by part, before and after issue 22's changes, in one process:
µs per call of each part's old and new form on the same inputs (best of ``--repeat`` timings).

- decode: tritonclient's ``InferResult`` + ``chunk_from_result`` (numpy per output) against
  ``chunk_from_response`` on the protobuf, for a one-token response and a final one;
- detokenize: ``IncrementalDetokenizer.push`` of one token (as before: a generator and a join per call;
  now: one dict lookup) and ``tokenizers.decoders.DecodeStream.step``, per token of a mixed text;
- SSE chunk: ``_sse(shape.text(text))`` (a chunk struct per token) against ``shape.text_sse(text)``;
- deadline: ``asyncio.timeout`` around each wait against the request's one ``_Deadline``;
- replica view: a request's dispatch, first token and release on a replica holding 30 or 1,000 streams,
  the view recounting its slots (as before) against counts kept as slots come and go.

The whole path's figure (what these add up to with the gRPC receive, the HTTP write and the rest) is
bench/gateway_capacity.py's, A/B against the old tree with ``--gateway-root``.

    .venv/bin/python -m bench.gateway_hot_path [--write-docs]
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import time
import timeit
from collections.abc import Callable, Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from tokenizers.decoders import DecodeStream
from tritonclient.grpc import InferResult

from bench.fake_replica import token_response
from bench.report import cpu_description, write_section
from bench.servers import REPO_ROOT
from gateway.openai.controller import CompletionShape, _sse
from gateway.openai.generation import _Deadline
from gateway.openai.job import TextEvent
from gateway.scheduling.replicas import ReplicaView, Slot
from sluice.domain import RequestClass
from sluice.engine_client import Delta, Sampling
from sluice.policy.fair_queue import WaitingRequest
from sluice.policy.load import PriorityLoad, ReplicaLoad
from sluice.text.detokenizer import TokenBytes
from sluice.text.tokenizer import TextCodec
from sluice.triton.client import chunk_from_response, chunk_from_result
from sluice.wire import EnginePriority

TEXT = "The quick brown fox jumps over the lazy dog. Ünïcödé 日本語 emoji 🎉🎉 done. " * 20


def per_call_us(fn: Callable[[], object], number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


class OldDetokenizer:
    """The detokenizer as it was: a generator and a join per push."""

    def __init__(self, token_bytes: TokenBytes) -> None:
        self._token_bytes = token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Iterable[int]) -> str:
        return self._decoder.decode(b"".join(self._token_bytes(t) for t in token_ids), final=False)


def decode_us(response: Any, repeat: int) -> tuple[float, float]:
    """µs to decode ``response``: InferResult + chunk_from_result, and chunk_from_response."""
    infer = response.infer_response
    generic = per_call_us(lambda: chunk_from_result(InferResult(infer)), 20_000, repeat)
    return generic, per_call_us(lambda: chunk_from_response(response), 20_000, repeat)


def deadline_us(number: int) -> tuple[float, float]:
    """µs a wait adds: asyncio.timeout around it, and the request's one _Deadline."""

    async def delta() -> Delta:
        return Delta([1])

    async def main() -> tuple[float, float]:
        began = time.perf_counter()
        for _ in range(number):
            await delta()
        bare = time.perf_counter() - began
        began = time.perf_counter()
        for _ in range(number):
            async with asyncio.timeout(60):
                await delta()
        with_timeout = time.perf_counter() - began
        deadline = _Deadline(time.monotonic() + 60)
        began = time.perf_counter()
        for _ in range(number):
            await deadline.wait(delta())
        with_deadline = time.perf_counter() - began
        deadline.close()
        return (with_timeout - bare) / number * 1e6, (with_deadline - bare) / number * 1e6

    return asyncio.run(main())


class OldReplicaView(ReplicaView):
    """The replica view as it was: ``load`` recounted its slots, and every add and remove re-marked each
    slot's pacing over every tenant (O(slots) per dispatch and release)."""

    def add(self, slot: Slot) -> None:
        super().add(slot)
        self._old_mark_paced()

    def remove(self, request_id: str) -> Slot | None:
        slot = super().remove(request_id)
        if slot is not None:
            self._old_mark_paced()
        return slot

    def _old_mark_paced(self) -> None:
        self.old_paced: dict[str, bool] = {}
        top: dict[str, int] = {}
        for slot in self.slots.values():
            top[slot.tenant_id] = min(top.get(slot.tenant_id, slot.priority), slot.priority)
        for slot in self.slots.values():
            self.old_paced[slot.request_id] = any(
                p < slot.priority for t, p in top.items() if t != slot.tenant_id
            )

    def load(self, key: str) -> ReplicaLoad:
        slots = self.slots.values()
        reserved = sum(s.kv_tokens for s in slots)
        num_prefilling = sum(1 for s in slots if not s.has_first_token)
        counts = [[0, 0, 0] for _ in EnginePriority]
        for slot in slots:
            count = counts[slot.priority]
            count[0] += 1
            count[1] += not slot.has_first_token
            count[2] += slot.kv_tokens
        return ReplicaLoad(
            key,
            min(self.free_kv_tokens, self.total_kv_tokens - reserved),
            self.total_kv_tokens,
            num_prefilling,
            len(self.slots),
            itl_ms=self.itl_ms,
            by_priority=tuple(PriorityLoad(*count) for count in counts),
        )


def dispatch_us(view_class: type[ReplicaView], num_streams: int, repeat: int) -> float:
    """µs of a request's own view work on a replica holding ``num_streams``: added at dispatch (the
    dispatch pass reads the load before and after), its first token, released (the pass reads it again)."""
    view = view_class(cast(Any, SimpleNamespace(replica="r")))
    view.total_kv_tokens = view.free_kv_tokens = 10**9
    now = time.monotonic()

    def slot(i: int) -> Slot:
        request = WaitingRequest(
            f"r{i}", f"t{i % 10}", 1.0, RequestClass.INTERACTIVE, 128, 128, now, now + 60
        )
        return Slot(request, now, view.engine, "r", EnginePriority(i % 3))

    for i in range(num_streams):
        view.add(slot(i))
    new = slot(num_streams)

    def one_request() -> None:
        view.load("r")
        view.add(new)
        view.load("r")
        view.first_token(new)
        new.has_first_token = False
        view.remove(new.request_id)
        view.load("r")

    return per_call_us(one_request, 2_000, repeat)


def measure(checkpoint_dir: Path, repeat: int) -> list[tuple[str, float, float]]:
    rows: list[tuple[str, float, float]] = []
    one, final = token_response([1234]), token_response([1234], ("length", 32, 0))
    for name, response in (("decode a one-token response", one), ("decode a final response", final)):
        rows.append((name, *decode_us(response, repeat)))
    codec = TextCodec.from_checkpoint(checkpoint_dir)
    ids = codec.encode(TEXT)
    token_bytes = codec._token_bytes
    tokenizer = codec._tokenizer

    def old_detok() -> None:
        detok = OldDetokenizer(token_bytes)
        for i in ids:
            detok.push([i])

    def new_detok() -> None:
        detok = codec.detokenizer()
        for i in ids:
            detok.push([i])

    def decode_stream() -> None:
        stream = DecodeStream(skip_special_tokens=True)
        for i in ids:
            stream.step(tokenizer, i)

    n = len(ids)
    old_us, new_us = (per_call_us(f, 20, repeat) / n for f in (old_detok, new_detok))
    rows.append(("detokenize a token", old_us, new_us))
    rows.append(
        (
            "  (tokenizers DecodeStream.step, not taken)",
            float("nan"),
            per_call_us(decode_stream, 20, repeat) / n,
        )
    )
    shape = CompletionShape(
        [
            cast(Any, SimpleNamespace)(
                request_id="cmpl-abc",
                created=1_700_000_000,
                model="sluice-tiny",
                system_fingerprint="fp",
                sampling=Sampling(16),
                prompt_text="",
                prompt_token_ids=[1],
            )
        ]
    )
    fox = TextEvent(" fox")
    rows.append(
        (
            "SSE bytes of a text chunk",
            per_call_us(lambda: _sse(shape.text(fox)), 50_000, repeat),
            per_call_us(lambda: shape.text_sse(fox), 50_000, repeat),
        )
    )
    for num_streams in (30, 1_000):
        rows.append(
            (
                f"a request's replica-view work, {num_streams:,} streams on the replica",
                dispatch_us(OldReplicaView, num_streams, repeat),
                dispatch_us(ReplicaView, num_streams, repeat),
            )
        )
    timeout_us, deadline_wait_us = min(deadline_us(50_000) for _ in range(repeat))
    rows.append(("deadline around a wait", timeout_us, deadline_wait_us))
    return rows


def table(rows: list[tuple[str, float, float]]) -> list[str]:
    lines = ["| part (per call) | before µs | after µs |", "|---|---:|---:|"]
    for name, before, after in rows:
        lines.append(f"| {name} | {'' if before != before else f'{before:.2f}'} | {after:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint-dir", type=Path, default=REPO_ROOT / ".sluice" / "models" / "sluice-tiny")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    lines = table(measure(args.checkpoint_dir, args.repeat))
    print("\n".join(lines))
    if args.write_docs:
        body = [
            "```\n.venv/bin/python -m bench.gateway_hot_path --write-docs\n```",
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {cpu_description()}, one process, best of "
            f"{args.repeat}:",
            "",
            *lines,
        ]
        write_section("gateway-hot-path", "\n".join(body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
