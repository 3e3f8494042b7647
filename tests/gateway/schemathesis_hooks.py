"""Hooks for the schemathesis run (tests/api/test_schemathesis.py), loaded through ``SCHEMATHESIS_HOOKS``.

Random strings almost never name the served model, so without help nearly every generated completion
request stops at 404 ``model_not_found`` and the fuzzer never reaches admission, quotas, the engine or
the stream. This hook puts the served model's name into two of every three bodies that carry a
``model`` string, and cuts one completion body in eight to a plain request with the body's own text
(which ones depends on the body itself, so a run is reproducible from its seed).
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
        # One body in eight keeps only its text (the generated prompt or a message's content) and whether
        # it streams: a request that passes validation and runs on the engine, however slow the host
        # (the count that reach it once depended on how many bodies a slow CPU generated in the time).
        if digest[2] % 8 == 0 and ("prompt" in body or "messages" in body):
            return _plain_request(body)
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


def _plain_request(body: dict[str, Any]) -> dict[str, Any]:
    """The body cut to a completion the gateway accepts: the served model, the body's own text where it is a
    string, four tokens, and its ``stream`` flag where it is a boolean."""
    text = body.get("prompt")
    if "messages" in body:
        messages = body["messages"]
        first = messages[0] if isinstance(messages, list) and messages else None
        text = first.get("content") if isinstance(first, dict) else None
    text = text if isinstance(text, str) and text else "x"
    plain: dict[str, Any] = {"model": SERVED_MODEL, "max_tokens": 4}
    if "messages" in body:
        plain["messages"] = [{"role": "user", "content": text}]
    else:
        plain["prompt"] = text
    if isinstance(body.get("stream"), bool):
        plain["stream"] = body["stream"]
    return plain
