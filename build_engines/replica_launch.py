"""How a TensorRT-LLM replica's ``tritonserver`` is started for a version's build: how many GPUs it
needs and what environment it runs with. One rule for the Kubernetes replica (its render init container
writes ``triton.env``, which the triton container sources before ``exec tritonserver``) and the local
launcher of ``sluice trtllm-smoke``.

A ``trtllm`` engine built for tp x pp = N > 1 ranks runs in the tensorrtllm backend's orchestrator mode:
with ``TRTLLM_ORCHESTRATOR=1`` the backend spawns one ``trtllmExecutorWorker`` per rank itself
(``ModelInstanceState::getParallelConfigFromParams`` in triton_backend/inflight_batcher_llm/src/
model_instance_state.cc; the worker's path is the ``executor_worker_path`` parameter), so one
``tritonserver`` process on a pod with N GPUs serves it, no ``mpirun``. The ``trtllm-llmapi`` model's
``LLM()`` spawns its own ranks. Either way the replica requests N GPUs.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

ORCHESTRATOR_ENV = "TRTLLM_ORCHESTRATOR"


def world_size(build_config: Mapping[str, Any] | None) -> int:
    """GPUs one replica of the version needs: tp_size x pp_size (1 for the CPU engine)."""
    config = build_config or {}
    sizes = []
    for name in ("tp_size", "pp_size"):
        value = config.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"build_config.{name} must be a positive integer, got {value!r}")
        sizes.append(value)
    return sizes[0] * sizes[1]


def triton_env(build_config: Mapping[str, Any] | None) -> dict[str, str]:
    """The environment ``tritonserver`` needs for this build (module docstring)."""
    config = build_config or {}
    if config.get("target") == "trtllm" and world_size(config) > 1:
        return {ORCHESTRATOR_ENV: "1"}
    return {}


def env_file_text(build_config: Mapping[str, Any] | None) -> str:
    """``triton_env`` as a POSIX shell file to source (it is never empty: a comment says the world size)."""
    lines = [f"# tritonserver's environment for a {world_size(build_config)}-GPU replica (build_engines)"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in triton_env(build_config).items()]
    return "\n".join(lines) + "\n"
