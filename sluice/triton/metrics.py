"""A replica's load from its Triton metrics text: the TensorRT-LLM backend's families, which the CPU
engine's model exports under the same names (``nv_trt_llm_kv_cache_block_metrics``,
``nv_trt_llm_request_metrics``), so the gateway reads GPU and CPU replicas the same way."""

from __future__ import annotations

import re

from sluice.wire import ReplicaStats

_SAMPLE = re.compile(r"^(nv_trt_llm_(?:kv_cache_block|request)_metrics)\{([^}]*)\}\s+(\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def replica_stats_from_metrics(text: str, model: str | None = None) -> ReplicaStats | None:
    """Parse the samples (of ``model`` when the text labels one); None if the families are missing."""
    kv: dict[str, float] = {}
    requests: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("nv_trt_llm_"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        if model is not None and labels.get("model", model) != model:
            continue
        value = float(match.group(3))
        if match.group(1) == "nv_trt_llm_kv_cache_block_metrics":
            kv[labels.get("kv_cache_block_type", "")] = value
        else:
            requests[labels.get("request_type", "")] = value
    if not {"max", "free", "tokens_per"} <= kv.keys() or not {"active", "waiting"} <= requests.keys():
        return None
    tokens_per_block = kv["tokens_per"]
    return ReplicaStats(
        num_kv_tokens_total=int(kv["max"] * tokens_per_block),
        num_kv_tokens_free=int(kv["free"] * tokens_per_block),
        num_waiting=int(requests["waiting"]),
        num_running=int(requests["active"] - requests["waiting"]),
    )
