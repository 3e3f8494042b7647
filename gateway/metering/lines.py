"""The usage outbox's line format (``outbox.py`` makes the lines durable): one JSON object per line, a
record's fields only, never any text."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from enum import Enum
from typing import Any

from sluice.domain import Outcome, RequestClass, UsageRecord


class Kind(Enum):
    """What a line says about its seq (see ``outbox.py``); the value is the line's key."""

    REC = "rec"
    DONE = "done"
    OPEN = "open"
    CKPT = "ckpt"


def record_to_json(rec: UsageRecord) -> dict[str, Any]:
    return {
        "tenant_id": rec.tenant_id,
        "request_id": rec.request_id,
        "model": rec.model,
        "model_version": rec.model_version,
        "prompt_tokens": rec.prompt_tokens,
        "output_tokens": rec.output_tokens,
        "status": rec.status.value,
        "started_at": rec.started_at.isoformat(),
        "finished_at": rec.finished_at.isoformat(),
        "attempt": rec.attempt,
        "idempotency_key": rec.idempotency_key,
        "ttft_ms": rec.ttft_ms,
        "itl_p95_ms": rec.itl_p95_ms,
        "request_class": rec.request_class.value,
    }


def record_from_json(d: dict[str, Any]) -> UsageRecord:
    """A line's record. Fields added since a line was written (a line of an older gateway, replayed after
    an upgrade) take the record's defaults: attempt 1, no key, no latencies, the interactive class."""
    return UsageRecord(
        tenant_id=d["tenant_id"],
        request_id=d["request_id"],
        model=d["model"],
        model_version=d["model_version"],
        prompt_tokens=int(d["prompt_tokens"]),
        output_tokens=int(d["output_tokens"]),
        status=Outcome(d["status"]),
        started_at=datetime.fromisoformat(d["started_at"]),
        finished_at=datetime.fromisoformat(d["finished_at"]),
        attempt=int(d.get("attempt", 1)),
        idempotency_key=d.get("idempotency_key"),
        ttft_ms=_optional_ms(d.get("ttft_ms")),
        itl_p95_ms=_optional_ms(d.get("itl_p95_ms")),
        request_class=RequestClass(d.get("request_class", RequestClass.INTERACTIVE)),
    )


def _optional_ms(value: Any) -> float | None:
    return None if value is None else float(value)


def rec_line(seq: int, rec: UsageRecord) -> bytes:
    return _line({"seq": seq, "rec": record_to_json(rec)})


def done_line(seq: int) -> bytes:
    return _line({"seq": seq, "done": True})


def open_line(seq: int, rec: UsageRecord) -> bytes:
    return _line({"seq": seq, "open": record_to_json(rec)})


def ckpt_line(seq: int, output_tokens: int, at: datetime) -> bytes:
    return _line({"seq": seq, "ckpt": {"output_tokens": output_tokens, "at": at.isoformat()}})


def lost_record(opened: UsageRecord, ckpt: dict[str, Any] | None) -> UsageRecord:
    """What a request a dead process left open is billed: its prompt and the output tokens of its last
    checkpoint, finished at that checkpoint (no checkpoint: no output, finished when it was opened). No
    latencies: the opened record has none, and checkpoints carry only a token count."""
    if ckpt is None:
        return replace(opened, output_tokens=0, status=Outcome.GATEWAY_LOST)
    return replace(
        opened,
        output_tokens=int(ckpt["output_tokens"]),
        status=Outcome.GATEWAY_LOST,
        finished_at=datetime.fromisoformat(ckpt["at"]),
    )


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def parse(raw: bytes) -> tuple[int, Kind]:
    """A line's seq and kind; raises if it could not be replayed."""
    obj = json.loads(raw)
    seq = int(obj["seq"])
    if obj.get("done"):
        return seq, Kind.DONE
    if "ckpt" in obj:
        if int(obj["ckpt"]["output_tokens"]) < 0:
            raise ValueError("negative checkpoint")
        datetime.fromisoformat(obj["ckpt"]["at"])
        return seq, Kind.CKPT
    kind = Kind.OPEN if "open" in obj else Kind.REC
    record_from_json(obj[kind.value])
    return seq, kind
