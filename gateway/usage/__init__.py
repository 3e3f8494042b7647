"""GET /v1/usage: the caller's own usage."""
