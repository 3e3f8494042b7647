"""A request that fails on an unexpected exception (a bug, not a replica's error) is a 500 whose telemetry
record names the exception's type only: a repr may carry the request's text (a UnicodeDecodeError holds
the bytes it failed on), and no prompt or output text is ever persisted."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path

import openai
import pytest
from fakes import ScriptedFakeEngine
from harness import MODEL, start_gateway

from sluice.engine_client import Delta, GenerateRequest

SECRET = "zebra-quartz-7731"


class TextCarryingBug(ScriptedFakeEngine):
    """A named fake: fails with an exception whose repr holds the prompt's text, as a decode bug would."""

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Delta, None]:
        raise UnicodeDecodeError("utf-8", SECRET.encode() + b"\xff", len(SECRET), len(SECRET) + 1, "bad")
        yield  # an async generator


def test_an_unexpected_error_is_500_and_its_telemetry_names_the_type_only(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    gateway = start_gateway(tmp_path, dev_checkpoint, engine=TextCarryingBug(token_id=5, interval_s=0.001))
    try:
        with pytest.raises(openai.InternalServerError):
            gateway.client().completions.create(model=MODEL, prompt=f"say {SECRET}", max_tokens=4)
        (record,) = [r for r in gateway.telemetry() if r["outcome"] == "failed"]
        assert record["error"] == "internal: UnicodeDecodeError"
        path = gateway.gw.settings.telemetry_path
        assert path is not None and SECRET not in path.read_text()
    finally:
        gateway.stop()
