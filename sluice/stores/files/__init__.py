"""Tenants' uploaded and generated files (OpenAI's Files API): bytes in an object store, S3 or a directory."""
