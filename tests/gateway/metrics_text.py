"""Read one sample from a Prometheus text endpoint (Triton's metrics)."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

SETTLE_S = 1.0


def read_metric(url: str, family: str, **labels: str) -> float:
    """The value of the sample of ``family`` whose labels include ``labels``; 0 if there is none yet."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    for line in text.splitlines():
        if line.startswith(family + "{") and all(w in line for w in wanted):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def used_kv_blocks(metrics_url: str) -> float:
    return read_metric(metrics_url, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used")


def settled_count(read: Callable[[], float], at_least: float, timeout_s: float = 10.0) -> float:
    """A Triton counter once it reached ``at_least`` and then held still for ``SETTLE_S``.

    NOTE: Triton counts an inference in its metrics a moment after the response (up to ~1 s seen), so a
    count read at once can miss the request just answered; waiting a settle period after it also lets a
    request that should not have run show up, so the caller can compare for equality."""
    deadline_s = time.monotonic() + timeout_s
    while read() < at_least and time.monotonic() < deadline_s:
        time.sleep(0.05)
    time.sleep(SETTLE_S)
    return read()
