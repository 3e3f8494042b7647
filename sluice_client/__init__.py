"""The Python client for a Sluice gateway (sync and asyncio) over the OpenAI wire format, built for safe
retries: every call carries an Idempotency-Key, the same on each retry; connection loss, 429, 5xx and 409
``idempotency_key_in_progress`` are retried, honouring ``retry-after-ms`` and ``Retry-After``; closing
or cancelling a stream hangs up, which stops the generation; a stream that fails midway raises
``StreamError`` with the text received so far.

Part of the ``sluice`` core: it imports only httpx and ``sluice_client`` itself, never the gateway.
"""

from sluice_client.aio import AsyncSluiceClient, AsyncStream
from sluice_client.errors import SluiceAPIError, SluiceConnectionError, SluiceError, StreamError
from sluice_client.retry import RetryPolicy
from sluice_client.sse import Chunk
from sluice_client.sync import SluiceClient, Stream
from sluice_client.wire import Completion

__all__ = [
    "AsyncSluiceClient",
    "AsyncStream",
    "Chunk",
    "Completion",
    "RetryPolicy",
    "SluiceAPIError",
    "SluiceClient",
    "SluiceConnectionError",
    "SluiceError",
    "Stream",
    "StreamError",
]
