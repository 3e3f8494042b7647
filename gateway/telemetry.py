"""One telemetry record per admitted request (refusals included), as a JSON line appended to a file."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class TelemetryRecord:
    request_id: str
    tenant_id: str
    model: str
    model_version: str
    replica: str
    engine_client: str
    # Time in the gateway before the engine call started (the replica's own queue is inside TTFT).
    queue_ms: float
    ttft_ms: float | None  # None when no token came
    replica_ttft_ms: float | None  # from the replica call's start to its first token (inside ttft_ms)
    prompt_tokens: int
    output_tokens: int
    inter_token_p50_ms: float | None
    inter_token_max_ms: float | None
    duration_ms: float
    outcome: str
    finish_reason: str | None
    error: str | None = None
    attempt: int = 1  # with an Idempotency-Key: this attempt's number
    superseded_output_tokens: int = 0  # waste: what the abandoned previous attempt had generated


class TelemetryWriter:
    """Appends records to ``path`` (None: records are dropped); safe from any thread."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: TelemetryRecord) -> None:
        if self._path is None:
            return
        line = json.dumps(asdict(record), separators=(",", ":")) + "\n"
        with self._lock, open(self._path, "a", encoding="utf-8") as f:
            f.write(line)
