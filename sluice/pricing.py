"""Prices for usage reports: USD per million prompt and output tokens, per model, with a discount on the
batch class (the cheaper asynchronous tier: batch lines and ``service_tier: "flex"`` requests).

``SLUICE_PRICES`` is JSON of model -> price, ``"*"`` being the price of every model not listed:
``{"*": {"prompt_usd_per_m": 0.2, "output_usd_per_m": 0.6}, "sluice-large": {...}}``. Unset: no model
has a price and reports show tokens only. ``SLUICE_BATCH_DISCOUNT`` (default 0.5) is the fraction taken
off batch tokens' price.

Arithmetic is decimal: the configured numbers are read as the decimals written, so a cost is exact
(1,234 prompt tokens at 0.2 USD per million cost 0.0002468 USD, not 0.00024680000000000003) and a sum
over grouped token counts equals the sum of its rows' costs. Floats only at the edge (``cost_usd``).

Pure: configuration and counts in, a cost out; no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from sluice.domain import RequestClass, UsageGroup

DEFAULT_MODEL = "*"  # the price of every model without one of its own
TOKENS_PER_PRICE_UNIT = Decimal(1_000_000)  # prices are per million tokens
# A bound no real price comes near (a dollar a token), so every cost a report can show is a finite float.
MAX_USD_PER_M = Decimal(1_000_000)


@dataclass(frozen=True)
class ModelPrice:
    """One model's price, in USD per million tokens (decimal, as configured)."""

    prompt_usd_per_m: Decimal
    output_usd_per_m: Decimal


_PRICE_FIELDS = tuple(f.name for f in fields(ModelPrice))


@dataclass(frozen=True)
class Prices:
    """Every model's price and the batch discount; ``Prices()`` prices nothing."""

    by_model: Mapping[str, ModelPrice] = field(default_factory=lambda: MappingProxyType({}))
    batch_discount: Decimal = Decimal("0.5")  # fraction taken off batch tokens (half), in [0, 1)

    def __post_init__(self) -> None:
        if not Decimal(0) <= self.batch_discount < Decimal(1):
            raise ValueError(f"batch_discount must be in [0, 1), got {self.batch_discount}")

    def price_of(self, model: str) -> ModelPrice | None:
        """``model``'s price, else the ``"*"`` price, else None (not priced)."""
        if model in self.by_model:
            return self.by_model[model]
        return self.by_model.get(DEFAULT_MODEL)

    def cost(
        self, model: str, request_class: RequestClass, prompt_tokens: int, output_tokens: int
    ) -> Decimal | None:
        """What the tokens cost in USD, exactly; None when ``model`` has no price."""
        if prompt_tokens < 0 or output_tokens < 0:
            raise ValueError(f"token counts must be >= 0, got {prompt_tokens}, {output_tokens}")
        price = self.price_of(model)
        if price is None:
            return None
        full = (prompt_tokens * price.prompt_usd_per_m + output_tokens * price.output_usd_per_m) / (
            TOKENS_PER_PRICE_UNIT
        )
        if request_class == RequestClass.BATCH:
            return full * (1 - self.batch_discount)
        return full

    def cost_usd(
        self, model: str, request_class: RequestClass, prompt_tokens: int, output_tokens: int
    ) -> float | None:
        """``cost`` as a float (the nearest to the exact decimal); None when ``model`` has no price."""
        exact = self.cost(model, request_class, prompt_tokens, output_tokens)
        return None if exact is None else float(exact)


def total_cost(prices: Prices, groups: Iterable[UsageGroup]) -> Decimal | None:
    """What a report's groups cost together, exactly; None when nothing is priced or one of the groups'
    models has no price (a total that left some rows out would read as the whole bill)."""
    if not prices.by_model:
        return None
    total = Decimal(0)
    for g in groups:
        cost = prices.cost(g.model, g.request_class, g.prompt_tokens, g.output_tokens)
        if cost is None:
            return None
        total += cost
    return total


def total_cost_usd(prices: Prices, groups: Iterable[UsageGroup]) -> float | None:
    """``total_cost`` as a report shows it: the float nearest the exact sum (summed in decimal first, so
    it is the same whichever order the groups come in); None as there."""
    total = total_cost(prices, groups)
    return None if total is None else float(total)


def parse_prices(text: str) -> dict[str, ModelPrice]:
    """``SLUICE_PRICES``'s JSON as each model's price. Raises ``ValueError`` naming the model and the field
    at fault: not an object, an unknown or missing field, a price that is not a finite number >= 0."""
    try:
        # NOTE: numbers as the decimals written (0.2 stays 0.2); NaN and Infinity come through as floats
        # and are refused below with the rest of the non-finite values.
        raw: Any = json.loads(text, parse_float=Decimal)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    example = '{"*": {"prompt_usd_per_m": 0.2, "output_usd_per_m": 0.6}}'
    if not isinstance(raw, dict):
        raise ValueError(f"must be a JSON object of model name -> price, e.g. {example}")
    prices: dict[str, ModelPrice] = {}
    for model, given in raw.items():
        if not model:
            raise ValueError('a model name must be non-empty ("*" is every model without a price)')
        if not isinstance(given, dict):
            raise ValueError(f"model {model!r}: must be an object of prices, e.g. {example}")
        unknown = sorted(set(given) - set(_PRICE_FIELDS))
        if unknown:
            known = ", ".join(_PRICE_FIELDS)
            raise ValueError(f"model {model!r}: unknown field(s) {', '.join(unknown)}; known: {known}")
        missing = [name for name in _PRICE_FIELDS if name not in given]
        if missing:
            raise ValueError(f"model {model!r}: missing field(s) {', '.join(missing)}")
        prices[model] = ModelPrice(**{name: _usd(model, name, given[name]) for name in _PRICE_FIELDS})
    return prices


def _usd(model: str, name: str, value: Any) -> Decimal:
    # NOTE: bool is an int in Python; ``true`` is not a price. Floats here are NaN and Infinity only.
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError(f"model {model!r}: {name} must be a number of USD per million tokens, got {value!r}")
    price = Decimal(value)
    if not price.is_finite() or not 0 <= price <= MAX_USD_PER_M:
        raise ValueError(
            f"model {model!r}: {name} must be a finite number in [0, {MAX_USD_PER_M}], got {value!r}"
        )
    return price


@lru_cache(maxsize=8)
def prices_from(prices_json: str | None, batch_discount: float) -> Prices:
    """The settings' ``prices`` and ``batch_discount`` as ``Prices`` (parsed once per distinct value).
    The discount is taken as the decimal its float prints as (0.3 is 0.3)."""
    by_model = parse_prices(prices_json) if prices_json is not None else {}
    return Prices(MappingProxyType(by_model), Decimal(repr(batch_discount)))
