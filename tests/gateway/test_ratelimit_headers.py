"""OpenAI's ``x-ratelimit-*-tokens`` headers, as the official client sees them: on every admitted completion
(stream or not) the tenant's budget, what its bucket holds after this request's reservation and how long it
takes to refill; on a token-budget 429 what the refusal saw; none for a tenant without a token budget, and
never ``x-ratelimit-*-requests`` (Sluice has no requests-per-minute limit).

Every tenant here makes its first request on a full bucket, so what the headers say is exact: the budget
less the reservation (prompt + max_tokens). Refill at 10 tokens/s cannot reach a whole token between the
acquire and its header."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fakes import ScriptedFakeEngine
from harness import MODEL, RunningGateway, start_gateway
from openai.types.chat import ChatCompletionMessageParam

from gateway.scheduling.quota_gate import openai_duration
from sluice.domain import Tenant
from sluice.stores.tenants.store import SqliteTenantStore
from sluice.text import TextCodec

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say something."}]
BUDGET_TOKENS_PER_MINUTE = 600  # 10 tokens/s
# 0.1 token/s: after one request of 1 + 4 tokens, 1 token left, and the next needs 5 (10 s of refill away).
TINY_TOKENS_PER_MINUTE = 6
MAX_TOKENS = 4
TENANTS = {
    "whole": Tenant("whole", "Whole", tokens_per_minute=BUDGET_TOKENS_PER_MINUTE),
    "stream": Tenant("stream", "Stream", tokens_per_minute=BUDGET_TOKENS_PER_MINUTE),
    "completion": Tenant("completion", "Completion", tokens_per_minute=BUDGET_TOKENS_PER_MINUTE),
    "unbudgeted": Tenant("unbudgeted", "Unbudgeted", tokens_per_minute=None, max_concurrent_requests=8),
    "tiny": Tenant("tiny", "Tiny", tokens_per_minute=TINY_TOKENS_PER_MINUTE),
    "replay": Tenant("replay", "Replay", tokens_per_minute=BUDGET_TOKENS_PER_MINUTE),
}


@pytest.fixture(scope="module")
def gateway_and_keys(
    dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningGateway, dict[str, str]]]:
    state_dir = tmp_path_factory.mktemp("ratelimit_headers")

    async def create() -> dict[str, str]:
        store = SqliteTenantStore(state_dir / "sluice.db")
        await store.open()
        try:
            return {name: await store.create(tenant) for name, tenant in TENANTS.items()}
        finally:
            await store.close()

    keys = asyncio.run(create())
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    gateway = start_gateway(state_dir, dev_checkpoint, engine=ScriptedFakeEngine(token_id, interval_s=0.001))
    try:
        yield gateway, keys
    finally:
        gateway.stop()


def client(gateway_and_keys: tuple[RunningGateway, dict[str, str]], tenant: str) -> openai.OpenAI:
    gateway, keys = gateway_and_keys
    return gateway.client(api_key=keys[tenant])


def assert_budget_headers(headers: httpx.Headers, limit_tokens: int, remaining_tokens: int) -> None:
    assert headers["x-ratelimit-limit-tokens"] == str(limit_tokens)
    assert headers["x-ratelimit-remaining-tokens"] == str(remaining_tokens)
    refill_s = (limit_tokens - remaining_tokens) / (limit_tokens / 60)
    assert headers["x-ratelimit-reset-tokens"] == go_duration(refill_s)
    assert not [name for name in headers if name.startswith("x-ratelimit-") and name.endswith("-requests")]


def go_duration(seconds: float) -> str:
    """What OpenAI writes for the whole-millisecond durations these tests produce (under an hour)."""
    total_ms = round(seconds * 1000)
    if total_ms < 1000:
        return f"{total_ms}ms" if total_ms else "0s"
    minutes, rest_ms = divmod(total_ms, 60_000)
    text = f"{rest_ms / 1000:g}s"
    return f"{minutes}m{text}" if minutes else text


def test_a_chat_completion_says_what_its_tenants_budget_holds_after_it(gateway_and_keys) -> None:
    raw = client(gateway_and_keys, "whole").chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS
    )
    completion = raw.parse()
    assert completion.usage is not None
    reserved_tokens = completion.usage.prompt_tokens + MAX_TOKENS
    assert_budget_headers(raw.headers, BUDGET_TOKENS_PER_MINUTE, BUDGET_TOKENS_PER_MINUTE - reserved_tokens)


def test_a_streamed_chat_completion_carries_the_same_headers(gateway_and_keys) -> None:
    raw = client(gateway_and_keys, "stream").chat.completions.with_raw_response.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    headers = raw.headers  # sent before the first chunk
    chunks = list(raw.parse())
    usage = chunks[-1].usage
    assert usage is not None
    reserved_tokens = usage.prompt_tokens + MAX_TOKENS
    assert_budget_headers(headers, BUDGET_TOKENS_PER_MINUTE, BUDGET_TOKENS_PER_MINUTE - reserved_tokens)


def test_a_completion_reports_its_reservation_not_its_use(gateway_and_keys) -> None:
    raw = client(gateway_and_keys, "completion").completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=MAX_TOKENS
    )
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens == 1
    assert_budget_headers(raw.headers, BUDGET_TOKENS_PER_MINUTE, BUDGET_TOKENS_PER_MINUTE - 1 - MAX_TOKENS)
    assert raw.headers["x-ratelimit-reset-tokens"] == "500ms"  # 5 tokens at 10 tokens/s


@pytest.mark.parametrize("stream", [False, True])
def test_a_tenant_without_a_token_budget_gets_no_rate_limit_headers(gateway_and_keys, stream: bool) -> None:
    raw = client(gateway_and_keys, "unbudgeted").chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=MAX_TOKENS, stream=stream
    )
    assert raw.status_code == 200
    assert not [name for name in raw.headers if name.startswith("x-ratelimit-")]


def test_a_token_refusal_says_what_the_bucket_held(gateway_and_keys) -> None:
    tiny = client(gateway_and_keys, "tiny")
    raw = tiny.completions.with_raw_response.create(model=MODEL, prompt="x", max_tokens=MAX_TOKENS)
    assert_budget_headers(raw.headers, TINY_TOKENS_PER_MINUTE, 1)  # 6 - (1 + 4)
    with pytest.raises(openai.RateLimitError) as err:
        tiny.completions.create(model=MODEL, prompt="x", max_tokens=MAX_TOKENS)
    assert err.value.code == "tokens_per_minute_exceeded"
    headers = err.value.response.headers
    assert_budget_headers(headers, TINY_TOKENS_PER_MINUTE, 1)  # the first used all it reserved: no refund
    assert headers["x-ratelimit-reset-tokens"] == "50s"  # 5 tokens at 0.1 token/s
    assert float(headers["retry-after-ms"]) > 0


def test_a_replay_takes_no_quota_and_carries_no_rate_limit_headers(gateway_and_keys) -> None:
    replay = client(gateway_and_keys, "replay")
    key = {"Idempotency-Key": "ratelimit-headers-replay"}
    first = replay.completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=MAX_TOKENS, extra_headers=key
    )
    assert first.headers["x-ratelimit-remaining-tokens"] == str(BUDGET_TOKENS_PER_MINUTE - 1 - MAX_TOKENS)
    again = replay.completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=MAX_TOKENS, extra_headers=key
    )
    assert again.parse().id == first.parse().id  # the stored result
    assert not [name for name in again.headers if name.startswith("x-ratelimit-")]


@pytest.mark.parametrize(
    ("seconds", "written"),
    [
        (0.0, "0s"),
        (0.0004, "1ms"),
        (0.25, "250ms"),
        (1.2, "1.2s"),
        (1.5, "1.5s"),
        (60.0, "1m0s"),
        (360.0, "6m0s"),
        (90.25, "1m30.25s"),
        (3600.0, "1h0m0s"),
        (-1.0, "0s"),
    ],
)
def test_durations_are_written_as_openai_writes_them(seconds: float, written: str) -> None:
    assert openai_duration(seconds) == written
