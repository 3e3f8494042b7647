"""The error every Sluice HTTP API answers with, in OpenAI's shape: ``{"error": {"message", "type",
"param", "code"}}`` with its HTTP status, and ``Retry-After`` (whole seconds, rounded up) when the caller
should come back. The gateway's ``OpenAIError`` and the control plane's ``AdminError`` are this, each
adding the headers its API owes."""

from __future__ import annotations

import math
from typing import Any


class ApiError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """``Retry-After`` in whole seconds (rounded up) when set."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}
