"""Issue 15: GET /v1/usage shows each row's request class and cost, and totals per (model, request class)
over the whole filter, with batch-class tokens (service_tier "flex", batch lines) at the configured
discount. Costs are checked against the exact decimal of the tokens the gateway counted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fakes import ScriptedFakeEngine
from harness import ACME_KEY, GLOBEX_KEY, MODEL, RunningGateway, start_gateway

from sluice.domain import Outcome, RequestClass, UsageRecord
from sluice.stores.ledger.store import SqliteLedger
from sluice.text import TextCodec

PROMPT_USD_PER_M, OUTPUT_USD_PER_M = Decimal("0.4"), Decimal("1.6")
PRICES_JSON = f'{{"{MODEL}": {{"prompt_usd_per_m": 0.4, "output_usd_per_m": 1.6}}}}'
BATCH_DISCOUNT = 0.25
RETIRED = "retired-model"  # a model with rows in the ledger and no price


def cost(prompt_tokens: int, output_tokens: int, request_class: str) -> Decimal:
    full = (prompt_tokens * PROMPT_USD_PER_M + output_tokens * OUTPUT_USD_PER_M) / 1_000_000
    return full * (1 - Decimal(str(BATCH_DISCOUNT))) if request_class == "batch" else full


@dataclass
class Priced:
    gateway: RunningGateway
    request_ids: dict[str, list[str]]  # by request class: the requests sent through the gateway


@pytest.fixture(scope="module")
def priced(dev_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Priced]:
    """A gateway with prices, after two interactive and two flex (batch-class) completions by acme, and a
    row of a model without a price written to its ledger."""
    state_dir = tmp_path_factory.mktemp("usage_pricing")
    token_id = TextCodec.from_checkpoint(dev_checkpoint).encode("ab")[0]
    engine = ScriptedFakeEngine(token_id, interval_s=0.0)
    gateway = start_gateway(
        state_dir, dev_checkpoint, engine=engine, prices=PRICES_JSON, batch_discount=BATCH_DISCOUNT
    )
    try:
        ids: dict[str, list[str]] = {"interactive": [], "batch": []}
        with gateway.client(ACME_KEY) as client:
            for request_class, extra, max_tokens in [
                ("interactive", {}, 3),
                ("batch", {"service_tier": "flex"}, 5),
                ("interactive", {"service_tier": "default"}, 7),
                ("batch", {"service_tier": "flex"}, 2),
            ]:
                done = client.completions.create(
                    model=MODEL, prompt="hello " * max_tokens, max_tokens=max_tokens, extra_body=extra
                )
                ids[request_class].append(done.id)
        for request_id in ids["interactive"] + ids["batch"]:
            gateway.usage_row(request_id)  # written in each request's finally
        asyncio.run(record_retired_row(state_dir))
        yield Priced(gateway, ids)
    finally:
        gateway.stop()


async def record_retired_row(state_dir: Path) -> None:
    ledger = SqliteLedger(state_dir / "sluice.db")
    await ledger.open()
    try:
        now = datetime.now(UTC)
        await ledger.record(
            UsageRecord("acme", "retired-1", RETIRED, "1", 11, 13, Outcome.FINISHED, now, now)
        )
    finally:
        await ledger.close()


def get_usage(gateway: RunningGateway, api_key: str = ACME_KEY, **params: str) -> tuple[int, dict[str, Any]]:
    with gateway.http() as http:
        resp = http.get("/v1/usage", params=params, headers={"Authorization": f"Bearer {api_key}"})
    body: dict[str, Any] = resp.json()
    return resp.status_code, body


def test_rows_carry_their_class_and_cost_with_batch_at_the_discount(priced: Priced) -> None:
    rows = {r["request_id"]: r for r in priced.gateway.usage(limit="1000")["data"]}
    for request_class, request_ids in priced.request_ids.items():
        for request_id in request_ids:
            row = rows[request_id]
            assert row["request_class"] == request_class
            assert row["prompt_tokens"] > 0 and row["output_tokens"] > 0
            expected = cost(row["prompt_tokens"], row["output_tokens"], request_class)
            assert row["cost_usd"] == float(expected), (request_class, row)
    # The discount shows: the batch row costs (1 - 0.25) of what the same tokens cost interactive.
    batch_row = rows[priced.request_ids["batch"][0]]
    full = cost(batch_row["prompt_tokens"], batch_row["output_tokens"], "interactive")
    assert Decimal(str(batch_row["cost_usd"])) == full * Decimal("0.75")
    retired = rows["retired-1"]
    assert (retired["request_class"], retired["cost_usd"]) == ("interactive", None)


def test_totals_break_down_by_model_and_class_over_the_whole_filter(priced: Priced) -> None:
    everything = priced.gateway.usage(limit="1000")
    one_row = priced.gateway.usage(limit="1")  # the totals cover every row, not only the one returned
    assert len(one_row["data"]) == 1 and one_row["totals"] == everything["totals"]
    totals, rows = everything["totals"], everything["data"]
    groups = {(g["model"], g["request_class"]): g for g in totals["by_model_and_class"]}
    assert list(groups) == [(RETIRED, "interactive"), (MODEL, "batch"), (MODEL, "interactive")]  # sorted
    for (model, request_class), g in groups.items():
        mine = [r for r in rows if (r["model"], r["request_class"]) == (model, request_class)]
        assert g["num_requests"] == len(mine)
        assert g["prompt_tokens"] == sum(r["prompt_tokens"] for r in mine)
        assert g["output_tokens"] == sum(r["output_tokens"] for r in mine)
        assert g["total_tokens"] == g["prompt_tokens"] + g["output_tokens"]
        if model == RETIRED:
            assert g["cost_usd"] is None
        else:
            assert g["cost_usd"] == float(cost(g["prompt_tokens"], g["output_tokens"], request_class))
    assert groups[(MODEL, "batch")]["num_requests"] == 2
    assert groups[(MODEL, "interactive")]["num_requests"] == 2
    assert totals["num_requests"] == 5
    assert totals["cost_usd"] is None  # one group has no price: no total that reads as the whole bill
    # Without the unpriced model's row, the total is the exact sum of the groups.
    priced_only = priced.gateway.usage(model=MODEL)["totals"]
    expected = sum(
        cost(g["prompt_tokens"], g["output_tokens"], g["request_class"])
        for g in priced_only["by_model_and_class"]
    )
    assert priced_only["cost_usd"] == float(expected) and priced_only["num_requests"] == 4


def test_the_request_class_filter_and_a_bad_class_is_a_400(priced: Priced) -> None:
    batch = priced.gateway.usage(request_class="batch")
    assert sorted(r["request_id"] for r in batch["data"]) == sorted(priced.request_ids["batch"])
    assert [g["request_class"] for g in batch["totals"]["by_model_and_class"]] == ["batch"]
    interactive = priced.gateway.usage(request_class="interactive", model=MODEL)
    assert sorted(r["request_id"] for r in interactive["data"]) == sorted(priced.request_ids["interactive"])
    status, body = get_usage(priced.gateway, request_class="premium")
    assert status == 400, body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "request_class"
    assert "'interactive', 'batch'" in body["error"]["message"]


def test_another_tenant_sees_none_of_the_rows_or_costs(priced: Priced) -> None:
    status, body = get_usage(priced.gateway, GLOBEX_KEY)
    assert status == 200 and body["tenant_id"] == "globex"
    assert body["data"] == [] and body["totals"]["by_model_and_class"] == []
    assert body["totals"]["num_requests"] == 0
    assert body["totals"]["cost_usd"] == 0.0  # priced, and nothing used


def test_without_prices_rows_show_tokens_and_no_cost(inprocess_gateway: RunningGateway) -> None:
    done = inprocess_gateway.client().completions.create(
        model=MODEL, prompt="x", max_tokens=1, extra_body={"service_tier": "flex"}
    )
    row = inprocess_gateway.usage_row(done.id)
    assert (row["request_class"], row["cost_usd"]) == (RequestClass.BATCH.value, None)
    totals = inprocess_gateway.usage()["totals"]
    assert totals["cost_usd"] is None
    assert all(g["cost_usd"] is None for g in totals["by_model_and_class"])
    assert (MODEL, "batch") in {(g["model"], g["request_class"]) for g in totals["by_model_and_class"]}
