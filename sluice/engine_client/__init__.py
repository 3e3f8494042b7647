"""One way for the gateway to reach a replica: ``EngineClient``, over Triton gRPC or in process, and the
wire types every side shares (``sluice.engine_client.wire``)."""

from sluice.engine_client.base import Delta, EngineClient, GenerateRequest, ReplicaStats
from sluice.engine_client.wire import EngineError, EngineErrorKind, EnginePriority, FinishReason

__all__ = [
    "Delta",
    "EngineClient",
    "EngineError",
    "EngineErrorKind",
    "EnginePriority",
    "FinishReason",
    "GenerateRequest",
    "ReplicaStats",
]
