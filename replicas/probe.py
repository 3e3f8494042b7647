"""Does a replica still make tokens? One real generation, asked by the control plane's health checks after
``verify_replica`` passes: a wedged engine (its Triton up and ready, its port open, no tokens coming)
passes every readiness check, so only a request that must produce a token catches it.

The probe: a fixed prompt of ``PROBE_PROMPT_IDS``, ``NUM_PROBE_TOKENS`` token, greedy, ``ignore_eos`` (so
it always makes its token), the engine's highest priority class (a busy replica admits it ahead of its
queue), in the cache scope ``PROBE_CACHE_SCOPE`` (no tenant's prefix-cache blocks are shared with it),
sent to the registry's model *at its version*. It passes when the stream delivers its token and ends
within ``timeout_s``. Anything else fails with the reason in words: ``wedged: no token within 2.0 s``,
a token but no end, the model's error, Triton's, an unreachable server. Nothing here raises for a
replica's answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from tritonclient.utils import InferenceServerException

from sluice.triton.client import check_client, chunk_from_result, request_tensors, to_infer_inputs
from sluice.wire import EngineError, EnginePriority

PROBE_CACHE_SCOPE = "sluice-health-probe"
# NOTE: small ids, inside every vocabulary we serve (the dev checkpoint has 8192); what they mean is moot.
PROBE_PROMPT_IDS = (1, 2, 3, 4)
NUM_PROBE_TOKENS = 1
DEFAULT_PROBE_TIMEOUT_S = 2.0
PROBE_REQUEST_ID = "sluice-health-probe"


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str  # why not, in words ("" when ok)
    elapsed_s: float  # from sending the request to the stream's end, or to giving up


@dataclass
class _Progress:
    """What the stream delivered before it ended or the deadline passed."""

    num_tokens: int = 0
    finish_reason: str | None = None


async def probe_replica(
    endpoint: str, model: str, version: str, timeout_s: float = DEFAULT_PROBE_TIMEOUT_S
) -> ProbeResult:
    """Run one probe generation on the replica at ``endpoint`` (its Triton gRPC address) against
    ``model`` at ``version``; it passes only if the token comes and the stream ends within ``timeout_s``."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    client = check_client(endpoint)
    progress = _Progress()
    started = time.monotonic()
    call: Any = None

    def result(detail: str) -> ProbeResult:
        return ProbeResult(detail == "", detail, time.monotonic() - started)

    try:
        call = client.stream_infer(_one_request(model, version))
        await asyncio.wait_for(_consume(call, progress), timeout_s)
        return result(_verdict(progress))
    except TimeoutError:
        if progress.num_tokens == 0:
            return result(f"wedged: no token within {timeout_s:.1f} s")
        return result(f"the probe's stream did not end within {timeout_s:.1f} s after its token")
    except EngineError as exc:
        return result(f"{endpoint}: the probe failed: {exc.kind}: {exc.message}")
    except InferenceServerException as exc:
        return result(f"{endpoint}: the probe failed: {exc.message() or exc}")
    except grpc.RpcError as exc:  # the transport: refused, reset, unavailable
        return result(f"{endpoint}: the probe failed: {_rpc_error_text(exc)}")
    finally:
        if call is not None:
            call.cancel()  # NOTE: a no-op once the stream ended; frees the request when it timed out
        await client.close()


def _one_request(model: str, version: str) -> AsyncIterator[dict[str, Any]]:
    tensors = request_tensors(
        PROBE_PROMPT_IDS,
        NUM_PROBE_TOKENS,
        cache_scope=PROBE_CACHE_SCOPE,
        ignore_eos=True,
        priority=int(EnginePriority.UNDER_SHARE),
    )  # no temperature, top-k or top-p: greedy

    async def one() -> AsyncIterator[dict[str, Any]]:
        # NOTE: the version is part of the request: a replica serving two versions is probed at the
        # registry's, as verify_replica checks that one.
        yield {
            "model_name": model,
            "model_version": version,
            "inputs": to_infer_inputs(tensors),
            "request_id": PROBE_REQUEST_ID,
        }

    return one()


async def _consume(call: Any, progress: _Progress) -> None:
    """Read the stream to its end (Triton ends it after the model's final response), noting progress."""
    async for response, error in call:
        if error is not None:
            raise error
        chunk = chunk_from_result(response)
        progress.num_tokens += len(chunk.token_ids)
        if chunk.finish_reason is not None:
            progress.finish_reason = chunk.finish_reason


def _verdict(progress: _Progress) -> str:
    if progress.num_tokens == 0:
        return f"the probe ended without a token (finish reason {progress.finish_reason})"
    if progress.finish_reason is None:
        return "the probe's stream ended without a finish reason"
    return ""


def _rpc_error_text(exc: grpc.RpcError) -> str:
    code = getattr(exc, "code", None)
    details = getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{code()}: {details()}"
    return str(exc)
