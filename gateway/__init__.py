"""The OpenAI-compatible HTTP gateway (Litestar): where a request enters Sluice."""
