"""The lines of a batch's output and error files, in OpenAI's shape:

``{"id": "batch_req_...", "custom_id": "...", "response": {"status_code": 200, "request_id": "...",
"body": {...}}, "error": null}``

A line answered with an HTTP error (refused at admission, a replica failure) has the error as its
``response``; a line that could not be run at all (malformed, cancelled or expired before it ran) has
``response: null`` and an ``error`` with a code and message. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import msgspec

_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True)
class LineResult:
    """How one line ended: ``ok`` lines go to the output file, the others to the error file."""

    index: int
    custom_id: str | None
    status_code: int | None  # None: never answered (``error_code`` says why)
    request_id: str | None = None
    body: Any = None  # the response body (an error body for a status >= 400)
    error_code: str | None = None
    error_message: str | None = None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and self.status_code < 400

    @property
    def outcome(self) -> str:
        """For the metrics: completed, failed (answered with an error), cancelled, expired or invalid."""
        if self.ok:
            return "completed"
        if self.status_code is not None:
            return "failed"
        return {"batch_cancelled": "cancelled", "batch_expired": "expired"}.get(
            self.error_code or "", "invalid"
        )

    def encode(self, batch_id: str) -> bytes:
        """The file line, newline included."""
        response = None
        if self.status_code is not None:
            response = {"status_code": self.status_code, "request_id": self.request_id, "body": self.body}
        error = None
        if self.error_code is not None:
            error = {"code": self.error_code, "message": self.error_message}
        line = {
            "id": line_id(batch_id, self.index),
            "custom_id": self.custom_id,
            "response": response,
            "error": error,
        }
        return _ENCODER.encode(line) + b"\n"


def not_run(index: int, custom_id: str | None, code: str, message: str) -> LineResult:
    return LineResult(index, custom_id, None, error_code=code, error_message=message)


def line_id(batch_id: str, index: int) -> str:
    """The line's ``id`` in the result files: the same on every run of it (a resumed batch names a line
    as the first run did)."""
    return "batch_req_" + hashlib.sha256(f"{batch_id}/{index}".encode()).hexdigest()[:32]


def result_file_id(batch_id: str, kind: str) -> str:
    """The id of the batch's ``kind`` ("output" or "error") file: the same whenever it is written."""
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:24]


def request_id(batch_id: str, custom_id: str) -> str:
    """The line's request id, which keys its usage row: one row per (batch, custom_id), whatever reruns."""
    return f"{batch_id}:{custom_id}"
