"""Tenants' token budgets and concurrency caps: one interface (base.py), in Redis or in process."""
