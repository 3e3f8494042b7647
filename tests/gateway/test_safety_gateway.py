"""Issue 5's safety filters through the gateway: a blocked prompt never reaches Triton; an output rule that
trips mid-stream on text the dev model really produces ends the stream with ``content_filter`` and a
terminal error event, the client never receives the matched text, and the generated tokens are metered."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import openai
import pytest
from harness import MODEL, RunningGateway, start_gateway
from metrics_text import read_metric, settled_count

from replicas.launcher import TritonServer

PROMPT = "def handler(event):\n"
MAX_TOKENS = 64


def _inferences(replica: TritonServer) -> float:
    return read_metric(replica.metrics_url, "nv_inference_request_success", model=MODEL) + read_metric(
        replica.metrics_url, "nv_inference_request_failure", model=MODEL
    )


def test_a_blocked_prompt_never_reaches_triton_and_an_ordinary_one_does(
    dev_checkpoint: Path, replica: TritonServer, tmp_path: Path
) -> None:
    config = tmp_path / "safety.json"
    config.write_text(json.dumps({"blocklist": ["forbidden phrase"]}))
    gateway = start_gateway(
        tmp_path / "gateway",
        dev_checkpoint,
        engine_client="triton",
        triton_grpc_url=replica.grpc_url,
        safety_config_path=config,
    )
    try:
        before = _inferences(replica)
        client = gateway.client()  # tenant acme: the default policy
        for prompt in ("say the forbidden phrase please", "say the Forbidden  Phrase"):
            with pytest.raises(openai.BadRequestError) as err:
                client.completions.create(model=MODEL, prompt=prompt, max_tokens=4)
            assert err.value.code == "content_filter" and "forbidden" not in str(err.value).lower()
        # An address or a card number in an ordinary prompt is served on the default policy (the PII
        # rules are a policy a tenant opts into: tests/safety/test_policy.py).
        for prompt in ("mail me at jane.doe@example.com please", "card 4111 1111 1111 1111 thanks"):
            client.completions.create(model=MODEL, prompt=prompt, max_tokens=1)
        assert settled_count(lambda: _inferences(replica), before + 2) == before + 2
        refused = [r for r in gateway.telemetry() if r["error"] == "content_filter"]
        assert len(refused) == 2 and all(r["outcome"] == "refused" for r in refused)
    finally:
        gateway.stop()


def _sse_events(gateway: RunningGateway) -> list[dict[str, object]]:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    with httpx.Client(base_url=gateway.base_url, timeout=60) as http:
        resp = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-acme-dev"})
    assert resp.status_code == 200
    return [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]


def test_an_output_rule_stops_the_stream_before_the_matched_text(
    dev_checkpoint: Path, tmp_path: Path
) -> None:
    # What the dev model says at temperature 0 (the output policy holds text back but changes nothing).
    plain = start_gateway(tmp_path / "plain", dev_checkpoint, engine_client="inprocess")
    try:
        unfiltered = "".join(str(e["choices"][0]["text"]) for e in _sse_events(plain) if e.get("choices"))  # type: ignore[index]
    finally:
        plain.stop()
    assert len(unfiltered) > 60
    start = len(unfiltered) // 2
    phrase = unfiltered[start : start + 8]  # well inside the output: the stream must trip mid-flight
    config = tmp_path / "safety.json"
    rule = {"name": "dev-phrase", "pattern": re.escape(phrase), "max_match_chars": len(phrase)}
    config.write_text(json.dumps({"regexes": [rule]}))

    gateway = start_gateway(
        tmp_path / "filtered", dev_checkpoint, engine_client="inprocess", safety_config_path=config
    )
    try:
        events = _sse_events(gateway)
        received = "".join(str(e["choices"][0]["text"]) for e in events if e.get("choices"))  # type: ignore[index]
        assert phrase not in received and unfiltered.startswith(received)
        assert received, "the text before the match is delivered"
        finish = [e for e in events if e.get("choices") and e["choices"][0]["finish_reason"]]  # type: ignore[index]
        assert finish[-1]["choices"][0]["finish_reason"] == "content_filter"  # type: ignore[index]
        assert events[-1]["error"]["code"] == "content_filter"  # type: ignore[index]
        assert phrase not in json.dumps(events[-1])
        request_id = str(finish[-1]["id"])
        row = gateway.usage_row(request_id)
        assert row["status"] == "filtered" and row["output_tokens"] > 0
        engine = gateway.gw.engine.engine_thread  # type: ignore[attr-defined]
        deadline = time.monotonic() + 1.0
        while engine.stats().num_blocks_used and time.monotonic() < deadline:  # aborted within a step
            time.sleep(0.01)
        assert engine.stats().num_blocks_used == 0
        assert row["output_tokens"] < MAX_TOKENS  # the engine stopped, not ran to max_tokens
        # Non-streamed: the same request ends with the same finish reason and the text before the match.
        whole = gateway.client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
        )
        assert whole.choices[0].finish_reason == "content_filter"
        assert phrase not in whole.choices[0].text and unfiltered.startswith(whole.choices[0].text)
    finally:
        gateway.stop()
