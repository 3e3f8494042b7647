"""Prometheus text as the control plane reads it (``sluice top``, the autoscaler's signals): one scrape's
samples, and the arithmetic over two scrapes of the same source (a counter's increase, a histogram's
quantile over the buckets' increase between them, summed over sources).

Pure: text and numbers in, numbers out; no I/O and no clock.

Labels match leniently, as the gateway's replica reader does (``sluice.triton.metrics``): a sample matches
``model="m"`` when its ``model`` label is ``m`` or when it has no ``model`` label at all (a replica's
families need not carry every label). The gateway's histograms always carry theirs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

LabelledValue = tuple[dict[str, str], float]


@dataclass(frozen=True)
class Metrics:
    """One scrape's samples by sample name (``foo_bucket``, ``foo_total``, ``foo``)."""

    samples: dict[str, list[LabelledValue]]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        """The Prometheus text exposition format; ``ValueError`` when it is not."""
        samples: dict[str, list[LabelledValue]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    samples[sample.name].append((dict(sample.labels), float(sample.value)))
        except (ValueError, TypeError, IndexError) as exc:
            raise ValueError(f"not Prometheus text: {exc}") from None
        return cls(dict(samples))

    def select(self, name: str, **match: str) -> list[LabelledValue]:
        """The samples called ``name`` whose labels match (see the module docstring)."""
        return [
            (labels, value)
            for labels, value in self.samples.get(name, [])
            if all(labels.get(key, wanted) == wanted for key, wanted in match.items())
        ]

    def total(self, name: str, **match: str) -> float | None:
        """The sum of the matching samples; None when there are none."""
        found = self.select(name, **match)
        return sum(value for _, value in found) if found else None

    def label_values(self, name: str, *keys: str) -> set[tuple[str, ...]]:
        """The distinct values of ``keys`` among the samples called ``name`` (those having them all)."""
        return {
            tuple(labels[key] for key in keys)
            for labels, _ in self.samples.get(name, [])
            if all(key in labels for key in keys)
        }


def increase(before: float | None, after: float | None) -> float | None:
    """A counter's increase between two scrapes: None if the second has none; the whole second value when
    the first had none (the series started since) or the counter went back (the process restarted)."""
    if after is None:
        return None
    if before is None or after < before:
        return after
    return after - before


def bucket_counts(metrics: Metrics, histogram: str, **match: str) -> dict[float, float]:
    """Upper bound -> cumulative count of the histogram ``histogram`` (its ``_bucket`` samples), summed
    over every matching series (e.g. all request classes of one version)."""
    counts: dict[float, float] = defaultdict(float)
    for labels, value in metrics.select(f"{histogram}_bucket", **match):
        if "le" in labels:
            counts[float(labels["le"])] += value
    return dict(counts)


def bucket_increase(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    """Each bucket's increase between two scrapes; the second scrape's counts as they are when any bucket
    went back (a restart: they count from zero since)."""
    deltas = {bound: count - before.get(bound, 0.0) for bound, count in after.items()}
    if any(delta < 0 for delta in deltas.values()):
        return dict(after)
    return deltas


def sum_buckets(parts: Iterable[dict[float, float]]) -> dict[float, float]:
    """Bucket counts of several series (gateways, request classes) added bound by bound."""
    total: dict[float, float] = defaultdict(float)
    for part in parts:
        for bound, count in part.items():
            total[bound] += count
    return dict(total)


def histogram_quantile(q: float, cumulative: dict[float, float]) -> float | None:
    """The ``q``-quantile of cumulative bucket counts, interpolated linearly inside its bucket as
    Prometheus's ``histogram_quantile`` does (the first bucket starts at 0). None when the histogram
    counted nothing (or has no ``+Inf`` bucket); the largest finite bound when the quantile lies beyond it.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1], got {q}")
    num_total = cumulative.get(math.inf, 0.0)
    if num_total <= 0:
        return None
    rank = q * num_total
    lower_bound, lower_count = 0.0, 0.0
    for bound in sorted(cumulative):
        count = cumulative[bound]
        if count >= rank and count > lower_count:
            if math.isinf(bound):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound
