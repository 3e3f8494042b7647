"""Degradation under persistent overload (issue 12 deliverable 6), through the gateway over the in-process
engine and the official openai client: a model driven into overload (the dispatch gate lets one request run
at a time, a backlog of long streams waits) takes its configured fallbacks on the requests admitted while
the overload lasts (Sluice-Degraded header, capped output, the batch class, the counter, the gauge,
telemetry), and no more once the load is gone and exit_after_s has passed. A bad configuration stops the
gateway at start, saying what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from harness import MODEL, RunningGateway, start_gateway, wait_until
from metrics_text import read_metric
from openai.types import Completion

CAP_TOKENS = 8
FALLBACKS = {
    MODEL: {
        "max_tokens_cap": CAP_TOKENS,
        "to_batch": True,
        "overload_wait_s": 0.3,
        "enter_after_s": 0.5,
        "exit_after_s": 1.0,
    }
}
NUM_BACKLOG = 6
BACKLOG_TOKENS = 120


@pytest.fixture(scope="module")
def gateway(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    gateway = start_gateway(
        tmp_path_factory.mktemp("gateway_degradation"),
        dev_checkpoint,
        engine_client="inprocess",
        max_prompt_tokens=256,
        max_output_tokens=256,
        # A replica whose inter-token latency is above 1 ms takes nothing new: one stream runs at a time
        # and the rest wait in the gateway's queue (a replica of tiny capacity).
        itl_target_ms=1.0,
        degradation=json.dumps(FALLBACKS),
    )
    yield gateway
    gateway.stop()


def _metric(gateway: RunningGateway, family: str, **labels: str) -> float:
    return read_metric(gateway.base_url + "/metrics", family, **labels)


def _output_tokens(completion: Completion) -> int:
    assert completion.usage is not None
    return completion.usage.completion_tokens


def _batch_ttft_count(gateway: RunningGateway) -> float:
    family = "sluice_gateway_time_to_first_token_seconds_count"
    return _metric(gateway, family, model=MODEL, request_class="batch")


def _backlog(gateway: RunningGateway, num_tokens: list[int]) -> list[threading.Thread]:
    """Long interactive streams, all admitted at once (before the overload they cause begins); each
    appends its output tokens to ``num_tokens``."""
    client = gateway.client()

    def stream() -> None:
        chunks = client.completions.create(
            model=MODEL, prompt="load", max_tokens=BACKLOG_TOKENS, stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "service_tier": "default"},
        )  # fmt: skip
        num_tokens.extend(c.usage.completion_tokens for c in chunks if c.usage is not None)

    threads = [threading.Thread(target=stream) for _ in range(NUM_BACKLOG)]
    for thread in threads:
        thread.start()
    return threads


def test_fallbacks_apply_while_the_model_is_overloaded_and_only_then(gateway: RunningGateway) -> None:
    client = gateway.client()
    # Not overloaded: served as asked.
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hello", max_tokens=20, extra_body={"ignore_eos": True}
    )
    assert "sluice-degraded" not in raw.headers and _output_tokens(raw.parse()) == 20
    assert _metric(gateway, "sluice_gateway_degraded_mode", model=MODEL) == 0

    backlog_tokens: list[int] = []
    backlog = _backlog(gateway, backlog_tokens)
    wait_until(
        lambda: _metric(gateway, "sluice_gateway_degraded_mode", model=MODEL) == 1, 20, "overload to begin"
    )
    batch_before = _batch_ttft_count(gateway)

    # Three requests arrive while the backlog waits (at once: each is degraded or not at its admission).
    def moved() -> Any:  # no class chosen: capped and moved to batch (non-streaming)
        return client.completions.with_raw_response.create(
            model=MODEL, prompt="hello", max_tokens=50, extra_body={"ignore_eos": True}
        )

    def interactive() -> Any:  # streaming, interactive chosen: capped, keeps its class
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=40, stream=True,
            service_tier="default", stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        return raw.headers, list(raw.parse())

    def under_cap() -> Any:  # asking for no more than the cap: only the class moves
        return client.completions.with_raw_response.create(
            model=MODEL, prompt="hello", max_tokens=CAP_TOKENS, extra_body={"ignore_eos": True}
        )

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(probe) for probe in (moved, interactive, under_cap)]
        raw, (stream_headers, chunks), raw_under = (f.result(timeout=60) for f in futures)
    completion = raw.parse()
    assert raw.headers["sluice-degraded"] == f"max_tokens_cap={CAP_TOKENS}, to_batch"
    assert _output_tokens(completion) == CAP_TOKENS and completion.model == MODEL
    assert stream_headers["sluice-degraded"] == f"max_tokens_cap={CAP_TOKENS}"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == CAP_TOKENS
    assert raw_under.headers["sluice-degraded"] == "to_batch"
    assert _output_tokens(raw_under.parse()) == CAP_TOKENS

    assert _batch_ttft_count(gateway) == batch_before + 2  # the two moved ran as batch
    assert _metric(gateway, "sluice_gateway_degraded_total", model=MODEL, action="max_tokens_cap") == 2
    assert _metric(gateway, "sluice_gateway_degraded_total", model=MODEL, action="to_batch") == 2
    records = {r["request_id"]: r for r in gateway.telemetry()}
    assert records[completion.id]["degraded"] == f"max_tokens_cap={CAP_TOKENS}, to_batch"
    assert records[completion.id]["output_tokens"] == CAP_TOKENS

    # The load goes away; exit_after_s later the model is served as asked again.
    for thread in backlog:
        thread.join(60)
    assert backlog_tokens == [BACKLOG_TOKENS] * NUM_BACKLOG  # admitted before the overload: not capped
    wait_until(
        lambda: _metric(gateway, "sluice_gateway_degraded_mode", model=MODEL) == 0, 10, "overload to end"
    )
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="hello", max_tokens=20, extra_body={"ignore_eos": True}
    )
    after = raw.parse()
    assert "sluice-degraded" not in raw.headers and _output_tokens(after) == 20
    assert {r["request_id"]: r for r in gateway.telemetry()}[after.id]["degraded"] is None
    assert _metric(gateway, "sluice_gateway_degraded_total", model=MODEL, action="to_batch") == 2


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ('{"sluice-tiny": {"max_token_cap": 64}}', "model 'sluice-tiny': unknown field(s) max_token_cap"),
        ('{"sluice-tiny": {"max_tokens_cap": 0}}', "max_tokens_cap must be an integer >= 1, got 0"),
        ('{"sluice-tiny": {"to_batch": true, "exit_after_s": -5}}', "exit_after_s must be a finite number"),
        ("{sluice-tiny", "not valid JSON"),
    ],
)
def test_a_bad_configuration_stops_the_gateway_at_start(value: str, says: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(SLUICE_STATE_DIR=str(tmp_path), SLUICE_DEGRADATION=value)
    done = subprocess.run(
        [sys.executable, "-m", "gateway"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "SLUICE_DEGRADATION" in done.stderr and says in done.stderr, done.stderr[-2000:]
