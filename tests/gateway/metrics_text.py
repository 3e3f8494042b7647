"""Read one sample from a Prometheus text endpoint (Triton's metrics)."""

from __future__ import annotations

import urllib.request


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
