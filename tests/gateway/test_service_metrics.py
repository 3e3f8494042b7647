"""The gateway's operator metrics (issue 15): queue age, admissions, KV occupancy per replica,
cancellations with their cancel-to-free latency, and usage tokens by model, version and class. Each is
read back from the gateway's own registry after the event that moves it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fakes import ScriptedFakeEngine
from harness import MODEL, RunningGateway, start_gateway, wait_until

from gateway.metrics import GatewayMetrics
from gateway.scheduling.scheduler import ModelScheduler
from sluice.domain import RequestClass
from sluice.engine_client import ReplicaStats
from sluice.policy.fair_queue import WaitingRequest
from sluice.settings import Settings
from sluice.text import TextCodec

QUEUE = {"model": "m", "version": "1", "pool": "general", "request_class": "interactive"}
REPLICA = {"model": "m", "version": "1", "replica": "fake-a"}


def _queued(request_id: str) -> WaitingRequest:
    now = time.monotonic()
    return WaitingRequest(request_id, "acme", 1.0, RequestClass.INTERACTIVE, 8, 8, now, now + 30)


async def _wait_for(cond: Callable[[], bool], timeout_s: float) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline_s, "the metric did not move"
        await asyncio.sleep(0.01)


def test_queue_age_admissions_and_replica_kv_occupancy(tmp_path: Path) -> None:
    async def main() -> None:
        metrics = GatewayMetrics()
        value = metrics.registry.get_sample_value
        scheduler = ModelScheduler("m", (), Settings(state_dir=tmp_path, checkpoint_dir=tmp_path), metrics)
        await scheduler.start()
        waiting = asyncio.create_task(scheduler.wait_for_dispatch(_queued("r1")))
        # No replica: the request waits, and the gauge reads its age as it grows (not only on events).
        await _wait_for(lambda: (value("sluice_gateway_queue_age_seconds", QUEUE) or 0) >= 0.1, 5)
        assert value("sluice_gateway_admitted_total", QUEUE) is None

        engine = ScriptedFakeEngine(token_id=5, interval_s=0.001)
        engine.replica = "fake-a"
        engine.stats = ReplicaStats(
            num_kv_tokens_total=1000, num_kv_tokens_free=250, num_waiting=0, num_running=1
        )
        await scheduler.add_replica(engine)
        slot = await asyncio.wait_for(waiting, 5)
        assert value("sluice_gateway_queue_age_seconds", QUEUE) == 0
        assert value("sluice_gateway_admitted_total", QUEUE) == 1
        assert value("sluice_gateway_replica_kv_used_ratio", REPLICA) == 0.75
        assert value("sluice_gateway_replica_kv_free_tokens", REPLICA) == 250
        assert value("sluice_gateway_replica_running_cap", REPLICA) == 0  # not bounded: no gaps seen yet

        # A request that lost its replica before a token is dispatched again: not a second admission.
        scheduler.release(slot)
        again = await scheduler.wait_for_dispatch(_queued("r1"), redispatch=True)
        assert value("sluice_gateway_admitted_total", QUEUE) == 1
        assert value("sluice_gateway_redispatches_total", {"model": "m", "version": "1"}) == 1

        # A replica that leaves rotation stops reporting, rather than freezing at its last occupancy.
        scheduler.drain_replica("fake-a")
        assert value("sluice_gateway_replica_kv_used_ratio", REPLICA) == 0.75  # it still holds a request
        scheduler.release(again)
        assert value("sluice_gateway_replica_kv_used_ratio", REPLICA) is None
        assert value("sluice_gateway_replica_kv_free_tokens", REPLICA) is None
        assert value("sluice_gateway_replica_running_cap", REPLICA) is None
        await scheduler.close()

    asyncio.run(main())


@pytest.fixture(scope="module")
def slow_gateway(
    dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, ScriptedFakeEngine]]:
    codec = TextCodec.from_checkpoint(dev_checkpoint)
    engine = ScriptedFakeEngine(codec.encode("ab")[0], interval_s=0.02)
    gateway = start_gateway(tmp_path_factory.mktemp("metrics"), dev_checkpoint, engine=engine)
    yield gateway, engine
    gateway.stop()


def test_a_client_that_leaves_is_counted_with_its_cancel_to_free_latency(
    slow_gateway: tuple[RunningGateway, ScriptedFakeEngine],
) -> None:
    gateway, engine = slow_gateway
    value = gateway.gw.metrics.registry.get_sample_value
    body = {"model": MODEL, "prompt": "x", "max_tokens": 500, "stream": True}
    with (
        httpx.Client(base_url=gateway.base_url, timeout=10) as http,
        http.stream(
            "POST", "/v1/completions", json=body, headers={"Authorization": "Bearer sk-acme-dev"}
        ) as resp,
    ):
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert '"text"' in first  # generating: the engine call is open, the slot held
    # The connection is closed: the gateway learns it, closes the engine call and frees the slot.
    labels = {"model": MODEL, "version": "1", "request_class": "interactive"}
    wait_until(lambda: value("sluice_gateway_cancellations_total", labels) == 1, 5, "the cancellation")
    assert value("sluice_gateway_cancel_to_free_seconds_count", labels) == 1
    cancel_to_free_s = value("sluice_gateway_cancel_to_free_seconds_sum", labels)
    assert cancel_to_free_s is not None and 0 < cancel_to_free_s < 0.5
    assert engine.cancelled == [engine.requests[-1].request_id]
    outcome = {**labels, "outcome": "cancelled"}
    assert value("sluice_gateway_request_outcomes_total", outcome) == 1
    # Its tokens count as usage under the request's model, version and class (unread ones included).
    num_output_tokens = value("sluice_gateway_output_tokens_total", labels)
    assert num_output_tokens is not None and 1 <= num_output_tokens < 500
    assert value("sluice_gateway_prompt_tokens_total", labels) == len(engine.requests[-1].prompt_token_ids)


def test_every_declared_metric_is_made_as_the_class_names_it() -> None:
    """The table (gateway.metrics._SPECS) and the class's typed attributes name the same metrics, once each,
    of the same kind: a metric added to one and not the other fails here, not at its first use."""
    from typing import get_type_hints

    from gateway import metrics as module

    hints = {k: v for k, v in get_type_hints(GatewayMetrics).items() if k != "registry"}
    specs = {spec.attr: spec for spec in module._SPECS}
    assert len(specs) == len(module._SPECS) and set(specs) == set(hints)
    assert {attr: spec.kind for attr, spec in specs.items()} == hints
    assert len({spec.name for spec in module._SPECS}) == len(module._SPECS)
    metrics = GatewayMetrics()
    assert all(type(getattr(metrics, attr)) is hint for attr, hint in hints.items())
