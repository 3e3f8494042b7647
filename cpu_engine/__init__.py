"""Sluice's CPU engine: a Llama-family model over a paged KV cache with continuous batching.

Import chain (one way): config → sampling → sequence → block_pool → scheduler → model → runner → engine.
"""
