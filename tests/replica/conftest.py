"""The replica tests' fixtures (a real tritonserver on free ports) live in tests/conftest.py, shared with
tests/gateway."""
