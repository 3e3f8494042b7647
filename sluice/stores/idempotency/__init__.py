"""Idempotency keys: one record per (tenant, Idempotency-Key), in Redis or in process (base.py)."""
