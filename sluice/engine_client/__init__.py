"""One way for the gateway to reach a replica: ``EngineClient``, over Triton gRPC
(``sluice.engine_client.triton``) or in process (``cpu_engine.client``), and the wire types every side
shares (``sluice.wire``)."""

from sluice.engine_client.base import Delta, EngineClient, GenerateRequest, Sampling, TokenLogprob
from sluice.wire import (
    EngineError,
    EngineErrorKind,
    EnginePriority,
    FinishReason,
    Guide,
    GuideKind,
    ReplicaStats,
)

__all__ = [
    "Delta",
    "EngineClient",
    "EngineError",
    "EngineErrorKind",
    "EnginePriority",
    "FinishReason",
    "GenerateRequest",
    "Guide",
    "GuideKind",
    "ReplicaStats",
    "Sampling",
    "TokenLogprob",
]
