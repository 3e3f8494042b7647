"""Hooks for the schemathesis run (tests/api/test_schemathesis.py), loaded through ``SCHEMATHESIS_HOOKS``.

Random strings almost never name the served model, so without help nearly every generated completion
request stops at 404 ``model_not_found`` and the fuzzer never reaches admission, quotas, the engine or
the stream. This hook puts the served model's name into two of every three bodies that carry a
``model`` string (which ones depends on the body itself, so a run is reproducible from its seed).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import schemathesis

SERVED_MODEL = os.environ.get("SCHEMATHESIS_SERVED_MODEL", "sluice-tiny")


@schemathesis.hook
def map_body(ctx: schemathesis.HookContext, body: Any) -> Any:
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).digest()
        if digest[0] % 3 != 0:
            body = {**body, "model": SERVED_MODEL}
        # The request features whose generated values are mostly refused (n past the limit, top_logprobs
        # without logprobs, a schema llguidance cannot compile): left out of half the bodies, so that
        # enough requests still reach the engine; the other half fuzzes them.
        if digest[1] % 2 == 0:
            body = {k: v for k, v in body.items() if k not in _OFTEN_REFUSED}
            # A generated prompt list mixes texts, ids and id lists (a 400) far more often than not.
            if "prompt" in body and not isinstance(body["prompt"], str):
                body["prompt"] = "x"
    return body


_OFTEN_REFUSED = frozenset(
    {
        "n",
        "logprobs",
        "top_logprobs",
        "echo",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
