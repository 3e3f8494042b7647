"""Reading a replica's load from Triton metrics text (TensorRT-LLM's families, which the CPU engine's model
exports under the same names)."""

from __future__ import annotations

from sluice.triton.metrics import replica_stats_from_metrics

TEXT = """\
# HELP nv_trt_llm_kv_cache_block_metrics KV cache blocks
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="m",version="1"} 2048
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="m",version="1"} 2000
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="m",version="1"} 48
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="m",version="1"} 16
nv_trt_llm_request_metrics{model="m",request_type="active",version="1"} 5
nv_trt_llm_request_metrics{model="m",request_type="waiting",version="1"} 2
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="other",version="1"} 99
nv_inference_request_success{model="m",version="1"} 7
"""


def test_parses_the_kv_pool_and_request_counts_of_one_model() -> None:
    stats = replica_stats_from_metrics(TEXT, "m")
    assert stats is not None
    assert (stats.num_kv_tokens_total, stats.num_kv_tokens_free) == (2048 * 16, 2000 * 16)
    assert (stats.num_running, stats.num_waiting) == (3, 2)


def test_missing_families_read_as_unknown_not_as_zero() -> None:
    assert replica_stats_from_metrics("nv_inference_request_success 1\\n", "m") is None
    assert replica_stats_from_metrics(TEXT, "no-such-model") is None
