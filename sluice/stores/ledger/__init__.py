"""The usage ledger: one row per (tenant, request), PostgreSQL in production, SQLite embedded."""
