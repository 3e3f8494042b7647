"""The autoscaler's signals from gateway metrics text (the gateway's own GatewayMetrics renders it): the
interactive queue depth summed over gateways, windowed p95 from bucket deltas between scrapes, a gateway's
first scrape as the base only, a restarted gateway, and a scrape over HTTP with one gateway down."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from control_plane.autoscaler.signals import GatewayScraper, combine, parse_gateway_metrics
from gateway.metrics import GatewayMetrics

KEY = ("sluice-tiny", "1")


def observe(metrics: GatewayMetrics, ttft_s: list[float], wait_s: list[float], depth: int) -> str:
    for value in ttft_s:
        metrics.ttft_s.labels(*KEY, "interactive").observe(value)
    for value in wait_s:
        metrics.queue_wait_s.labels(*KEY, "general", "interactive").observe(value)
    metrics.queue_wait_s.labels(*KEY, "long-prompt", "interactive").observe(9.0)  # not the scaled pool
    metrics.ttft_s.labels(*KEY, "batch").observe(9.0)  # batch never counts
    metrics.queue_depth.labels(*KEY, "general", "interactive").set(depth)
    metrics.queue_depth.labels(*KEY, "general", "batch").set(100)
    metrics.queue_depth.labels(*KEY, "long-prompt", "interactive").set(50)
    return metrics.render().decode()


def test_windows_sum_gateways_and_count_only_what_happened_since_the_last_scrape() -> None:
    gw_a, gw_b = GatewayMetrics(), GatewayMetrics()
    first = {"a": parse_gateway_metrics(observe(gw_a, [5.0] * 50, [5.0] * 50, 3))}
    assert combine(first, {})[KEY].ttft_p95_s is None  # the base: the slow past is not this window
    assert combine(first, {})[KEY].queue_depth == 3
    # Next window: gateway a saw 39 fast and 1 slow request, gateway b (new) is counted from now on.
    second = {
        "a": parse_gateway_metrics(observe(gw_a, [0.03] * 39 + [1.0], [0.002] * 40, 2)),
        "b": parse_gateway_metrics(observe(gw_b, [0.03] * 10, [0.002] * 10, 4)),
    }
    window = combine(second, first)[KEY]
    assert window.queue_depth == 6  # 2 + 4: interactive, general pool only
    # Gateway a's 40 (b's first scrape is its base): rank 38 lies in the 20-40 ms bucket holding 39,
    # interpolated as Prometheus does; the one slow request is past it.
    assert window.ttft_p95_s == pytest.approx(0.02 + 0.02 * 38 / 39)
    assert window.queue_wait_p95_s == pytest.approx(0.001 + 0.0015 * 38 / 40)


def test_scraper_reads_the_gateways_that_answer() -> None:
    gateway = GatewayMetrics()
    text = observe(gateway, [0.2], [0.01], 1)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "down":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text=text)

    async def run() -> None:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        scraper = GatewayScraper(["http://up:8080/metrics", "http://down:8080/metrics"], client)
        first = await scraper.read()
        assert first is not None and first[KEY].queue_depth == 1
        await scraper.close()
        none = GatewayScraper(
            ["http://down:8080/metrics"], httpx.AsyncClient(transport=httpx.MockTransport(handler))
        )
        assert await none.read() is None
        await none.close()

    asyncio.run(run())
