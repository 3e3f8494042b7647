"""The OpenAI API through the official client, against a running gateway over the in-process engine."""

from __future__ import annotations

import openai
import pytest
from harness import GLOBEX_KEY, MODEL, RunningGateway
from openai.types import Completion
from openai.types.chat import ChatCompletionMessageParam

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something about def and return."}]


def test_chat_non_stream(inprocess_gateway: RunningGateway) -> None:
    resp = inprocess_gateway.client().chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=12,
        temperature=0,
    )
    assert resp.id.startswith("chatcmpl-") and resp.model == MODEL and resp.object == "chat.completion"
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.prompt_tokens > 0
    assert 1 <= resp.usage.completion_tokens <= 12
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    row = inprocess_gateway.usage_row(resp.id)
    assert row["status"] == "finished" and row["output_tokens"] == resp.usage.completion_tokens


def test_stream_matches_non_stream_and_include_usage_ends_with_usage(
    inprocess_gateway: RunningGateway,
) -> None:
    client = inprocess_gateway.client()
    whole = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]
    assert len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(inprocess_gateway: RunningGateway) -> None:
    chunks = list(
        inprocess_gateway.client().chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=4,
            stream=True,
        )
    )
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def test_completions_stream_and_not(inprocess_gateway: RunningGateway) -> None:
    client = inprocess_gateway.client()
    whole = client.completions.create(model=MODEL, prompt="import os\n", max_tokens=10, temperature=0)
    assert whole.id.startswith("cmpl-") and whole.object == "text_completion"
    assert whole.usage is not None and whole.usage.completion_tokens <= 10
    chunks: list[Completion] = list(
        client.completions.create(
            model=MODEL, prompt="import os\n", max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )


def test_max_tokens_finishes_with_length(inprocess_gateway: RunningGateway) -> None:
    resp = inprocess_gateway.client().completions.create(
        model=MODEL, prompt="class Foo:\n", max_tokens=3, temperature=0
    )
    assert resp.usage is not None
    if resp.choices[0].finish_reason == "length":
        assert resp.usage.completion_tokens == 3


def test_stop_string_truncates_and_finishes_with_stop(inprocess_gateway: RunningGateway) -> None:
    client = inprocess_gateway.client()
    full = client.completions.create(model=MODEL, prompt="def f(x):\n", max_tokens=40, temperature=0)
    text = full.choices[0].text
    assert len(text) >= 8, text
    stop = text[5:8]
    expected = text[: text.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(
                client.completions.create(
                    model=MODEL, prompt="def f(x):\n", max_tokens=40, temperature=0, stop=[stop], stream=True
                )
            )
            got = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            resp = client.completions.create(
                model=MODEL, prompt="def f(x):\n", max_tokens=40, temperature=0, stop=stop
            )
            got, reason = resp.choices[0].text, resp.choices[0].finish_reason
        assert got == expected and reason == "stop"


def test_seeded_sampling_is_reproducible(inprocess_gateway: RunningGateway) -> None:
    client = inprocess_gateway.client()
    texts = {
        client.completions.create(
            model=MODEL, prompt="x = ", max_tokens=12, temperature=1.0, top_p=0.9, seed=42
        )
        .choices[0]
        .text
        for _ in range(2)
    }
    assert len(texts) == 1


def test_models_lists_the_dev_model(inprocess_gateway: RunningGateway) -> None:
    assert [m.id for m in inprocess_gateway.client().models.list()] == [MODEL]


def test_a_model_is_retrieved_by_name_and_an_unknown_one_is_404(inprocess_gateway: RunningGateway) -> None:
    client = inprocess_gateway.client()
    found = client.models.retrieve(MODEL)
    assert (found.id, found.object, found.owned_by) == (MODEL, "model", "sluice")
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("no-such-model")
    assert err.value.code == "model_not_found" and "no-such-model" in err.value.message


def test_an_endpoint_not_served_is_404_naming_it_as_openai_does(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        inprocess_gateway.client().embeddings.create(model=MODEL, input="hello")
    body = err.value.body
    assert isinstance(body, dict) and body["message"] == "Invalid URL (POST /v1/embeddings)", body
    assert err.value.code == "not_found"
    with inprocess_gateway.http() as http:
        wrong = http.delete("/v1/models", headers={"Authorization": "Bearer sk-acme-dev"})
    assert wrong.status_code == 405
    assert wrong.json()["error"]["message"] == "Invalid method for URL (DELETE /v1/models)"


def test_bad_key_is_401_invalid_api_key(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.AuthenticationError) as err:
        inprocess_gateway.client(api_key="sk-nope").chat.completions.create(model=MODEL, messages=CHAT)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"


def test_long_prompt_is_400_context_length_exceeded(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        inprocess_gateway.client().completions.create(model=MODEL, prompt="word " * 2000, max_tokens=4)
    assert err.value.code == "context_length_exceeded"


def test_too_many_output_tokens_is_400(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        inprocess_gateway.client().completions.create(model=MODEL, prompt="x", max_tokens=100_000)
    assert err.value.param == "max_tokens"


def test_unknown_model_is_404_model_not_found(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        inprocess_gateway.client().chat.completions.create(model="gpt-9", messages=CHAT)
    assert err.value.code == "model_not_found"


def test_n_above_the_limit_is_a_clear_400(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        inprocess_gateway.client().chat.completions.create(model=MODEL, messages=CHAT, n=9)
    assert (err.value.param, err.value.code) == ("n", "integer_above_max_value")
    assert "Expected a value <= 8, but got 9" in err.value.message


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"model": "sluice-tiny"}', b'{"model": "sluice-tiny", "messages": "hi"}', b"[]"],
)
def test_malformed_bodies_are_400_invalid_request_error(
    inprocess_gateway: RunningGateway, body: bytes
) -> None:
    with inprocess_gateway.http() as http:
        resp = http.post(
            "/v1/chat/completions",
            content=body,
            headers={"Authorization": "Bearer sk-acme-dev", "Content-Type": "application/json"},
        )
    assert resp.status_code == 400
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_oversized_body_is_413(inprocess_gateway: RunningGateway) -> None:
    body = b'{"model": "sluice-tiny", "prompt": "' + b"a" * (128 * 1024) + b'"}'
    with inprocess_gateway.http() as http:
        resp = http.post(
            "/v1/completions",
            content=body,
            headers={"Authorization": "Bearer sk-acme-dev", "Content-Type": "application/json"},
        )
    assert resp.status_code == 413 and "error" in resp.json()


def test_health_ready_metrics_openapi(inprocess_gateway: RunningGateway) -> None:
    with inprocess_gateway.http() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        ready = http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["model_loaded"] is True
        metrics = http.get("/metrics").text
        assert "sluice_gateway_requests_total" in metrics and "sluice_gateway_requests_in_flight" in metrics
        schema = http.get("/schema/openapi.json").json()
        assert "/v1/chat/completions" in schema["paths"] and "/v1/usage" in schema["paths"]


def test_usage_is_per_tenant_and_filtered(inprocess_gateway: RunningGateway) -> None:
    client = inprocess_gateway.client()
    resp = client.completions.create(model=MODEL, prompt="usage ", max_tokens=2)
    row = inprocess_gateway.usage_row(resp.id)
    assert row["model"] == MODEL and row["prompt_tokens"] == resp.usage.prompt_tokens  # type: ignore[union-attr]
    globex_ids = {r["request_id"] for r in inprocess_gateway.usage(api_key=GLOBEX_KEY, limit="1000")["data"]}
    assert resp.id not in globex_ids
    assert inprocess_gateway.usage(model="other")["totals"]["num_requests"] == 0
    future = inprocess_gateway.usage(since="2999-01-01T00:00:00Z")
    assert future["totals"]["num_requests"] == 0 and future["data"] == []
    total = inprocess_gateway.usage(since="0")["totals"]
    assert (
        total["num_requests"] >= 1
        and total["total_tokens"] == total["prompt_tokens"] + total["output_tokens"]
    )


def test_one_telemetry_record_per_request(inprocess_gateway: RunningGateway) -> None:
    resp = inprocess_gateway.client().completions.create(model=MODEL, prompt="tele", max_tokens=5)
    inprocess_gateway.usage_row(resp.id)  # written in the same finally, after the telemetry
    records = [r for r in inprocess_gateway.telemetry() if r["request_id"] == resp.id]
    assert len(records) == 1
    rec = records[0]
    assert rec["tenant_id"] == "acme" and rec["outcome"] == "finished" and rec["replica"] == "inprocess"
    assert rec["ttft_ms"] is not None and rec["ttft_ms"] > 0 and rec["queue_ms"] >= 0
    # Each of the three is rounded to 3 decimals on its own: together they may be off by 1.5e-3.
    assert 0 < rec["replica_ttft_ms"] <= rec["ttft_ms"] - rec["queue_ms"] + 2e-3
    assert rec["output_tokens"] == resp.usage.completion_tokens  # type: ignore[union-attr]


@pytest.mark.parametrize("stream", [False, True])
def test_server_timing_splits_ttft_into_gateway_and_replica(
    inprocess_gateway: RunningGateway, stream: bool
) -> None:
    raw = inprocess_gateway.client().completions.with_raw_response.create(
        model=MODEL, prompt="timing", max_tokens=3, stream=stream
    )
    parts = dict(p.strip().split(";dur=") for p in raw.headers["server-timing"].split(","))
    assert set(parts) == {"gateway", "replica-ttft"}
    assert float(parts["gateway"]) >= 0 and float(parts["replica-ttft"]) > 0
    request_id = raw.headers["x-request-id"]
    if stream:
        list(raw.parse())  # type: ignore[call-overload]
    inprocess_gateway.usage_row(request_id)
    [rec] = [r for r in inprocess_gateway.telemetry() if r["request_id"] == request_id]
    assert abs(rec["replica_ttft_ms"] - float(parts["replica-ttft"])) < 1e-2


def test_metrics_count_requests_tokens_and_latencies(inprocess_gateway: RunningGateway) -> None:
    client = inprocess_gateway.client()
    resp = client.completions.create(model=MODEL, prompt="metrics", max_tokens=4)
    inprocess_gateway.usage_row(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with inprocess_gateway.http() as http:
        text = http.get("/metrics").text
    lines = text.splitlines()

    def value(prefix: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(prefix))

    assert (
        value('sluice_gateway_requests_total{outcome="finished",route="/v1/completions",status_code="200"}')
        >= 1
    )
    assert (
        value('sluice_gateway_requests_total{outcome="rejected",route="/v1/completions",status_code="404"}')
        >= 1
    )
    assert value("sluice_gateway_time_to_first_token_seconds_count") >= 1
    assert value("sluice_gateway_inter_token_seconds_count") >= 3
    version = f'model="{MODEL}",request_class="interactive",version="'
    assert value(f"sluice_gateway_time_to_first_token_seconds_count{{{version}") >= 1
    pool = f'model="{MODEL}",pool="general",request_class="interactive",version="'
    assert value(f"sluice_gateway_queue_wait_seconds_count{{{pool}") >= 1
    assert value("sluice_gateway_output_tokens_total") >= 4
    assert value("sluice_gateway_requests_in_flight") == 0


def test_missing_authorization_is_401(inprocess_gateway: RunningGateway) -> None:
    with inprocess_gateway.http() as http:
        resp = http.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"


def test_chat_content_parts_are_joined(inprocess_gateway: RunningGateway) -> None:
    client = inprocess_gateway.client()
    as_parts = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi"}]}
        ],
        max_tokens=6,
        temperature=0,
    )
    as_text = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=6, temperature=0
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert as_parts.usage == as_text.usage
