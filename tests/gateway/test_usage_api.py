"""GET /v1/usage through a gateway: the time filters accept unix seconds and ISO 8601, and any value no
timestamp can hold (overflowing numbers, NaN, infinities, years past 9999 once in UTC) is a 400 naming the
parameter, never a 500."""

from __future__ import annotations

import pytest
from harness import ACME_KEY, MODEL, RunningGateway

OUT_OF_RANGE = [
    "1e20",
    "-1e20",
    "1e308",
    "9" * 400,  # an integer float() reads as inf
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "253402300800",  # 10000-01-01T00:00:00Z
    "-62135596801",  # one second before 0001-01-01T00:00:00Z
    "9999-12-31T23:59:59-05:00",  # year 10000 in UTC
    "0001-01-01T00:00:00+05:00",  # year 0 in UTC
    "99999-01-01",
    "2026-13-01",
]


def usage(gateway: RunningGateway, **params: str) -> tuple[int, dict[str, object]]:
    with gateway.http() as http:
        resp = http.get("/v1/usage", params=params, headers={"Authorization": f"Bearer {ACME_KEY}"})
    body: dict[str, object] = resp.json()
    return resp.status_code, body


@pytest.mark.parametrize("param", ["since", "until"])
def test_a_time_no_timestamp_can_hold_is_a_400_naming_the_parameter(
    inprocess_gateway: RunningGateway, param: str
) -> None:
    for value in OUT_OF_RANGE:
        status, body = usage(inprocess_gateway, **{param: value})
        assert status == 400, (value, body)
        error = body["error"]
        assert isinstance(error, dict) and error["type"] == "invalid_request_error"
        assert error["param"] == param
        assert value[:20] in error["message"]


def test_times_at_the_edges_of_the_range_and_in_every_form_are_accepted(
    inprocess_gateway: RunningGateway,
) -> None:
    inprocess_gateway.client().completions.create(model=MODEL, prompt="x", max_tokens=1)
    everything = usage(inprocess_gateway)[1]["totals"]
    assert isinstance(everything, dict) and everything["num_requests"] >= 1
    for since, until in [
        ("0", "4102444800"),  # 1970 .. 2100
        ("-62135596800", "253402300799.999"),  # 0001-01-01 .. 9999-12-31T23:59:59.999 (UTC)
        ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59+00:00"),
        ("1970-01-01T01:00:00+01:00", "2100-01-01"),  # naive means UTC
        ("", ""),  # empty: no bound
    ]:
        status, body = usage(inprocess_gateway, since=since, until=until)
        assert status == 200, (since, until, body)
        assert body["totals"] == everything
    status, body = usage(inprocess_gateway, since="4102444800")  # the future: nothing yet
    assert status == 200 and isinstance(body["totals"], dict) and body["totals"]["num_requests"] == 0
