"""A real gateway whose Redis refuses every quota script the way a server out of memory or a read-only
replica does (a named fake Redis on loopback: the shared server must not be reconfigured): requests are
served on the fail-open path, counted in the metrics, never answered 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, MODEL, start_gateway
from redis_faults import OOM, OOM_IN_SCRIPT_BEFORE_7, READONLY, FaultyRedis

from sluice.text import TextCodec


@pytest.fixture(params=[OOM, READONLY, OOM_IN_SCRIPT_BEFORE_7], ids=["oom", "readonly", "oom-before-7"])
def faulty_redis(request: pytest.FixtureRequest) -> Iterator[FaultyRedis]:
    fake = FaultyRedis(request.param)
    fake.serve()
    yield fake
    fake.stop()


def test_a_redis_that_refuses_writes_takes_the_fail_open_path(
    dev_checkpoint: Path, tmp_path: Path, faulty_redis: FaultyRedis
) -> None:
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    gateway = start_gateway(
        tmp_path,
        dev_checkpoint,
        engine=ScriptedFakeEngine(token_id, interval_s=0.001),
        redis_url=faulty_redis.url,
        dev_tenants=True,
    )
    try:
        completion = gateway.client(ACME_KEY).completions.create(model=MODEL, prompt="x", max_tokens=4)
        assert completion.usage is not None and completion.usage.completion_tokens == 4
        assert faulty_redis.num_refused >= 1  # the quota script was sent, and refused
        with gateway.http() as http:
            metrics = http.get("/metrics").text
        assert "sluice_gateway_quota_fail_open_total 1.0" in metrics
        assert 'status_code="500"' not in metrics
    finally:
        gateway.stop()
