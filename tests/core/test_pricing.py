"""Prices for usage reports (sluice/pricing.py) and their settings: exact decimal costs, the default
price, the batch discount, and every bad ``SLUICE_PRICES`` refused at start naming the model and field."""

from __future__ import annotations

from decimal import Decimal

import pytest

from sluice.domain import RequestClass, UsageGroup
from sluice.pricing import ModelPrice, Prices, parse_prices, prices_from, total_cost
from sluice.settings import SettingsError, load_settings

INTERACTIVE, BATCH = RequestClass.INTERACTIVE, RequestClass.BATCH
PRICES_JSON = (
    '{"*": {"prompt_usd_per_m": 0.2, "output_usd_per_m": 0.6},'
    ' "sluice-large": {"prompt_usd_per_m": 3, "output_usd_per_m": 15}}'
)


def test_costs_are_exact_decimals_of_the_configured_prices() -> None:
    prices = prices_from(PRICES_JSON, 0.5)
    # 1,234 x 0.2 / 1e6 + 567 x 0.6 / 1e6 = 0.0002468 + 0.0003402
    assert prices.cost("sluice-tiny", INTERACTIVE, 1234, 567) == Decimal("0.0005870")
    assert prices.cost_usd("sluice-tiny", INTERACTIVE, 1234, 567) == 0.000587  # the nearest float
    assert prices.cost_usd("sluice-large", INTERACTIVE, 1_000_000, 1_000_000) == 18.0  # its own price
    assert prices.cost_usd("sluice-large", INTERACTIVE, 0, 0) == 0.0


def test_batch_tokens_cost_the_discounted_price() -> None:
    half_off = prices_from(PRICES_JSON, 0.5)
    assert half_off.cost("sluice-tiny", BATCH, 1234, 567) == Decimal("0.0002935")
    assert half_off.cost_usd("sluice-large", BATCH, 1_000_000, 1_000_000) == 9.0
    assert half_off.cost_usd("sluice-large", "batch", 1_000_000, 0) == 1.5  # type: ignore[arg-type]
    quarter_off = prices_from(PRICES_JSON, 0.25)
    assert quarter_off.cost_usd("sluice-large", BATCH, 1_000_000, 1_000_000) == 13.5
    no_discount = prices_from(PRICES_JSON, 0.0)
    assert no_discount.cost_usd("sluice-large", BATCH, 1_000_000, 1_000_000) == 18.0
    # A discount that is not a binary fraction is still exact: 0.3 off 10 USD is 7 USD.
    assert prices_from(PRICES_JSON, 0.3).cost("sluice-tiny", BATCH, 50_000_000, 0) == Decimal("7")


def test_a_sum_of_rows_costs_the_same_as_its_token_sums() -> None:
    """Reports price a group by its token sums: decimal arithmetic makes that the sum of its rows."""
    prices = prices_from(PRICES_JSON, 0.5)
    rows = [(1, 3), (7, 11), (1234, 567), (99_999, 1)]
    by_row = sum(prices.cost("sluice-tiny", BATCH, p, o) or Decimal(0) for p, o in rows)
    by_sum = prices.cost("sluice-tiny", BATCH, sum(p for p, _ in rows), sum(o for _, o in rows))
    assert by_row == by_sum == Decimal("0.0102987")


def test_a_total_is_the_exact_sum_of_its_groups_or_none_when_one_is_unpriced() -> None:
    groups = [
        UsageGroup("sluice-large", BATCH, 2, 1_000_000, 1_000_000),  # 9 USD
        UsageGroup("sluice-tiny", INTERACTIVE, 3, 1234, 567),  # 0.000587 USD
    ]
    assert total_cost(prices_from(PRICES_JSON, 0.5), groups) == Decimal("9.000587")
    assert total_cost(prices_from(PRICES_JSON, 0.5), []) == Decimal(0)
    only_large = prices_from('{"sluice-large": {"prompt_usd_per_m": 3, "output_usd_per_m": 15}}', 0.5)
    assert total_cost(only_large, groups) is None
    assert total_cost(Prices(), []) is None  # nothing priced: no cost, not a cost of 0


def test_no_price_for_a_model_means_no_cost() -> None:
    assert Prices().cost_usd("sluice-tiny", INTERACTIVE, 10, 10) is None
    assert prices_from(None, 0.5).cost_usd("sluice-tiny", BATCH, 10, 10) is None
    only_large = prices_from('{"sluice-large": {"prompt_usd_per_m": 1, "output_usd_per_m": 2}}', 0.5)
    assert only_large.cost_usd("sluice-tiny", INTERACTIVE, 10, 10) is None
    assert only_large.price_of("sluice-large") == ModelPrice(Decimal(1), Decimal(2))


def test_negative_token_counts_and_discounts_outside_0_1_are_refused() -> None:
    with pytest.raises(ValueError, match="token counts"):
        prices_from(PRICES_JSON, 0.5).cost("sluice-tiny", INTERACTIVE, -1, 0)
    for bad in (Decimal(1), Decimal("-0.1")):
        with pytest.raises(ValueError, match="batch_discount"):
            Prices(batch_discount=bad)


def test_settings_read_prices_and_discount_and_default_to_none_and_half() -> None:
    plain = load_settings()
    assert plain.prices is None and plain.batch_discount == 0.5
    assert plain.pricing.cost_usd("sluice-tiny", INTERACTIVE, 10, 10) is None
    priced = load_settings(prices=PRICES_JSON, batch_discount=0.75)
    assert priced.pricing.cost_usd("sluice-large", BATCH, 1_000_000, 1_000_000) == 4.5


@pytest.mark.parametrize(
    ("prices_json", "expected"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"m": 0.2}', "model 'm': must be an object"),
        ('{"": {"prompt_usd_per_m": 1, "output_usd_per_m": 1}}', "non-empty"),
        ('{"m": {"prompt_usd_per_m": 1, "output_usd_per_m": 1, "cached": 0}}', r"unknown field\(s\) cached"),
        ('{"m": {"prompt_usd_per_m": 1}}', r"missing field\(s\) output_usd_per_m"),
        ('{"m": {"prompt_usd_per_m": -0.1, "output_usd_per_m": 1}}', "prompt_usd_per_m must be a finite"),
        ('{"m": {"prompt_usd_per_m": 1, "output_usd_per_m": NaN}}', "output_usd_per_m must be a finite"),
        ('{"m": {"prompt_usd_per_m": Infinity, "output_usd_per_m": 1}}', "must be a finite"),
        ('{"m": {"prompt_usd_per_m": 1, "output_usd_per_m": 1e400}}', r"in \[0, 1000000\]"),
        ('{"m": {"prompt_usd_per_m": "0.2", "output_usd_per_m": 1}}', "must be a number"),
        ('{"m": {"prompt_usd_per_m": true, "output_usd_per_m": 1}}', "must be a number"),
    ],
)
def test_bad_prices_fail_at_start_naming_the_variable_model_and_field(
    prices_json: str, expected: str
) -> None:
    with pytest.raises(ValueError, match=expected):
        parse_prices(prices_json)
    with pytest.raises(SettingsError, match="SLUICE_PRICES") as info:
        load_settings(prices=prices_json)
    assert info.match(expected)


@pytest.mark.parametrize("discount", [-0.1, 1.0, 1.5])
def test_a_batch_discount_outside_0_1_fails_at_start(discount: float) -> None:
    with pytest.raises(SettingsError, match="SLUICE_BATCH_DISCOUNT"):
        load_settings(batch_discount=discount)


def test_prices_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICE_PRICES", PRICES_JSON)
    monkeypatch.setenv("SLUICE_BATCH_DISCOUNT", "0.25")
    got = load_settings().pricing
    assert got.cost_usd("sluice-large", BATCH, 1_000_000, 1_000_000) == 13.5
    monkeypatch.setenv("SLUICE_PRICES", '{"*": {"prompt": 1}}')
    with pytest.raises(SettingsError, match=r"SLUICE_PRICES=.*unknown field\(s\) prompt"):
        load_settings()
