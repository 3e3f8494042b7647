"""Tenants and their API keys: who is calling. PostgreSQL in production, SQLite embedded."""
