"""One way for the gateway to reach a replica: ``EngineClient``, over Triton gRPC or in process."""

from sluice.engine_client.base import (
    Delta,
    EngineClient,
    EngineError,
    EngineErrorKind,
    FinishReason,
    GenerateRequest,
    ReplicaStats,
)

__all__ = [
    "Delta",
    "EngineClient",
    "EngineError",
    "EngineErrorKind",
    "FinishReason",
    "GenerateRequest",
    "ReplicaStats",
]
