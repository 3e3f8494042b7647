"""The autoscaler's signals, read from the gateways' ``/metrics``: per model version, the interactive queue
depth now (``sluice_gateway_queue_depth``, summed over gateways; the general pool's, the one scaled here:
a long-prompt queue is not) and the p95 of queue wait (general pool) and TTFT (every prompt) over
the window since the previous scrape (``sluice_gateway_queue_wait_seconds`` and
``sluice_gateway_time_to_first_token_seconds``: bucket counts now minus the counts at the previous scrape,
summed over gateways; a gateway that restarted counts from zero).

The p95 is interpolated inside its bucket as Prometheus's ``histogram_quantile`` does (the arithmetic of
``control_plane.metrics_text``, which ``sluice top`` reads by too, so both show the figure a dashboard
would); past the last finite bucket, that bound. No request in the window: None (the policy reads it as
"nothing measured"). A gateway's first scrape only sets its base.

``parse_gateway_metrics`` and ``combine`` are pure; ``GatewayScraper`` does the HTTP and keeps each
gateway's previous counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from control_plane.metrics_text import (
    Metrics,
    bucket_counts,
    bucket_increase,
    histogram_quantile,
    sum_buckets,
)

log = logging.getLogger("sluice.control_plane.autoscaler")

QUEUE_DEPTH = "sluice_gateway_queue_depth"
QUEUE_WAIT = "sluice_gateway_queue_wait_seconds"
TTFT = "sluice_gateway_time_to_first_token_seconds"
SCALED_CLASS = "interactive"  # batch waits by design: its queue is not a reason to scale
SCALED_POOL = "general"  # the queue of the pool the autoscaler scales (long-prompt replicas are not)
SCRAPE_TIMEOUT_S = 2.0
QUANTILE = 0.95

VersionKey = tuple[str, str]  # (model, version)
Buckets = dict[float, float]  # upper bound (le) -> cumulative count


@dataclass
class GatewaySample:
    """One gateway's interactive figures per version: queue depth, cumulative histogram buckets."""

    queue_depth: dict[VersionKey, float] = field(default_factory=dict)
    queue_wait: dict[VersionKey, Buckets] = field(default_factory=dict)
    ttft: dict[VersionKey, Buckets] = field(default_factory=dict)


@dataclass(frozen=True)
class WindowSignals:
    """What the gateways said about one version: queue depth now, p95s over the last window."""

    queue_depth: float = 0.0
    queue_wait_p95_s: float | None = None
    ttft_p95_s: float | None = None


def parse_gateway_metrics(text: str) -> GatewaySample:
    """The interactive samples of the three families, by (model, version); other lines are ignored.
    ``ValueError`` when ``text`` is not Prometheus text."""
    metrics = Metrics.parse(text)
    sample = GatewaySample()
    for labels, value in metrics.select(QUEUE_DEPTH, request_class=SCALED_CLASS, pool=SCALED_POOL):
        if "model" in labels:
            key = (labels["model"], labels.get("version", ""))
            sample.queue_depth[key] = sample.queue_depth.get(key, 0.0) + value
    # NOTE: TTFT has no pool label (every prompt counts); queue wait is the scaled pool's.
    for family, found in ((QUEUE_WAIT, sample.queue_wait), (TTFT, sample.ttft)):
        for model, version in metrics.label_values(f"{family}_bucket", "model", "version"):
            found[(model, version)] = bucket_counts(
                metrics, family, model=model, version=version, request_class=SCALED_CLASS, pool=SCALED_POOL
            )
    return sample


def combine(
    samples: Mapping[str, GatewaySample], previous: Mapping[str, GatewaySample]
) -> dict[VersionKey, WindowSignals]:
    """Every version any gateway reported: depths summed, window p95s over the summed bucket deltas."""
    keys: set[VersionKey] = set()
    for sample in samples.values():
        keys |= sample.queue_depth.keys() | sample.queue_wait.keys() | sample.ttft.keys()
    result = {}
    for key in sorted(keys):
        depth = sum(s.queue_depth.get(key, 0.0) for s in samples.values())
        waits, ttfts = [], []
        for url, sample in samples.items():
            before = previous.get(url)  # None: its first scrape, which only sets the base
            if key in sample.queue_wait:
                base = None if before is None else before.queue_wait.get(key, {})
                waits.append(_window(sample.queue_wait[key], base))
            if key in sample.ttft:
                base = None if before is None else before.ttft.get(key, {})
                ttfts.append(_window(sample.ttft[key], base))
        result[key] = WindowSignals(
            depth,
            histogram_quantile(QUANTILE, sum_buckets(waits)),
            histogram_quantile(QUANTILE, sum_buckets(ttfts)),
        )
    return result


def _window(now: Buckets, before: Buckets | None) -> Buckets:
    """The counts added since ``before`` (a restarted gateway's from zero); none on a first scrape."""
    return {} if before is None else bucket_increase(before, now)


class GatewayScraper:
    """Scrapes every gateway's metrics; keeps each one's previous sample for the windows."""

    def __init__(self, urls: list[str], client: httpx.AsyncClient | None = None) -> None:
        self.urls = urls
        self._client = client or httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S)
        self._previous: dict[str, GatewaySample] = {}
        self._failing: set[str] = set()  # logged once when a gateway stops answering, once when it is back

    async def close(self) -> None:
        await self._client.aclose()

    async def read(self) -> dict[VersionKey, WindowSignals] | None:
        """The signals since the last read; None when no gateway answered (nothing is known)."""
        results = await asyncio.gather(*(self._scrape(url) for url in self.urls))
        samples = {url: s for url, s in zip(self.urls, results, strict=True) if s is not None}
        if not samples:
            return None
        signals = combine(samples, self._previous)
        self._previous.update(samples)
        return signals

    async def _scrape(self, url: str) -> GatewaySample | None:
        try:
            response = await self._client.get(url)
            response.raise_for_status()
            sample = parse_gateway_metrics(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            level = logging.DEBUG if url in self._failing else logging.WARNING
            self._failing.add(url)
            log.log(level, "autoscaler: gateway metrics %s not read: %s", url, exc or type(exc).__name__)
            return None
        if url in self._failing:
            self._failing.discard(url)
            log.info("autoscaler: gateway metrics %s read again", url)
        return sample
