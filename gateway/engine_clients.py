"""Build the engine client named in settings (``engine_client``: "triton" or "inprocess"). No fallback:
an unknown name fails at start, and the choice is logged."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sluice.engine_client.base import EngineClient

log = logging.getLogger(__name__)

ENGINE_CLIENTS = ("triton", "inprocess")


def open_engine_client(
    kind: str,
    *,
    model_name: str,
    triton_grpc_url: str = "",
    triton_metrics_url: str | None = None,
    checkpoint_dir: Path | None = None,
    engine_dtype: str = "auto",
    build_config: Mapping[str, Any] | None = None,
) -> EngineClient:
    """The client for ``kind``. ``engine_dtype`` is the in-process engine's number format (a Triton
    replica's comes from its model repository's ``dtype`` parameter). ``build_config``: the Triton
    replica's, as a registry version records it; its ``target`` picks the request dialect (none: the CPU
    engine's)."""
    if kind == "triton":
        from sluice.engine_client.dialects import dialect_of
        from sluice.engine_client.triton import TritonEngineClient

        client: EngineClient = TritonEngineClient(
            triton_grpc_url, model_name, metrics_url=triton_metrics_url, dialect=dialect_of(build_config)
        )
    elif kind == "inprocess":
        from cpu_engine.client import InProcessEngineClient
        from cpu_engine.config import EngineConfig, check_dtype_setting

        if checkpoint_dir is None:
            raise ValueError("engine_client 'inprocess' needs checkpoint_dir")
        config = EngineConfig(dtype=check_dtype_setting(engine_dtype))
        client = InProcessEngineClient(checkpoint_dir, model_name, config)
    else:
        raise ValueError(f"engine_client must be one of {ENGINE_CLIENTS}, got {kind!r}")
    log.info("engine client: %s (replica %s, model %s)", client.kind, client.replica, model_name)
    return client
