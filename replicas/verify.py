"""Is a replica serving the registry's version? Asked by the control plane's health checks before a
replica is marked ready (and on every check after), and by a gateway before its first request to one.

A replica passes only if its Triton reports that model version ready AND the model configuration it
serves carries the registry's weights digest (the ``weights_digest`` parameter the renderer writes and
the CPU engine's model checks against its checkpoint at load). Anything else, an unreachable server
included, fails with the reason in words; nothing here raises for a replica's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from sluice.triton.client import check_client

DIGEST_PARAMETER = "weights_digest"


@dataclass(frozen=True)
class Verification:
    ok: bool
    detail: str  # why not, in words ("" when ok)


async def verify_replica(
    endpoint: str, model: str, version: str, expected_digest: str, timeout_s: float = 2.0
) -> Verification:
    """Check the replica at ``endpoint`` (its Triton gRPC address) serves ``model`` at ``version`` with
    weights digesting to ``expected_digest``."""
    client = check_client(endpoint)
    try:
        return await asyncio.wait_for(_verify(client, model, version, expected_digest), timeout_s)
    except TimeoutError:
        return Verification(False, f"no answer from {endpoint} within {timeout_s:.1f} s")
    except InferenceServerException as exc:
        return Verification(False, f"{endpoint}: {exc.message() or exc}")
    finally:
        await client.close()


def served_digest(model_config: Mapping[str, Any]) -> str:
    """The ``weights_digest`` parameter of a model configuration as Triton's gRPC API returns it in JSON
    (``{"config": {"parameters": {...}}}``); "" when it has none. Every model Sluice renders declares it the
    same way (the CPU engine's, TensorRT-LLM's ``tensorrt_llm`` and ``llmapi``)."""
    parameters = model_config.get("config", {}).get("parameters", {})
    return str(parameters.get(DIGEST_PARAMETER, {}).get("string_value", ""))


async def _verify(
    client: grpcclient.InferenceServerClient, model: str, version: str, expected_digest: str
) -> Verification:
    if not await client.is_model_ready(model, version):
        return Verification(False, f"model {model} version {version} is not ready")
    served = served_digest(await client.get_model_config(model, version, as_json=True))
    if not served:
        return Verification(False, f"model {model} version {version} declares no {DIGEST_PARAMETER}")
    if served != expected_digest:
        return Verification(
            False,
            f"model {model} version {version} serves weights {served}, the registry says {expected_digest}",
        )
    return Verification(True, "")
