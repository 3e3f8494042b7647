"""Every TensorRT-LLM replica Deployment asks for the GPUs its build runs on (tp_size x pp_size), tells the
render init container the same count, and starts tritonserver through the env file that init container
writes (orchestrator mode for more than one rank: build_engines.replica_launch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from build_engines.replica_launch import ORCHESTRATOR_ENV, env_file_text, world_size

BASE = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "base"
REPLICAS = sorted(BASE.glob("replica-*.yaml"))


def _deployment(path: Path) -> dict:
    (deployment,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "Deployment"]
    return deployment


@pytest.mark.parametrize("path", REPLICAS, ids=lambda p: p.name)
def test_gpu_requests_equal_the_builds_tp_times_pp(path: Path) -> None:
    spec = _deployment(path)["spec"]["template"]["spec"]
    (render,) = [c for c in spec["initContainers"] if c["name"] == "render-repository"]
    env = {e["name"]: e.get("value") for e in render["env"]}
    gpus = world_size(json.loads(env["BUILD_CONFIG_JSON"]))
    (triton,) = [c for c in spec["containers"] if c["name"] == "triton"]
    resources = triton["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == str(gpus)
    assert env["GPU_COUNT"] == str(gpus)
    assert env["TRITON_ENV_FILE"] == "/scratch/triton.env"
    assert triton["command"] == ["sh", "-c"]
    assert triton["args"][0].startswith(". /scratch/triton.env && exec tritonserver ")


def test_more_than_one_rank_runs_in_orchestrator_mode() -> None:
    assert ORCHESTRATOR_ENV not in env_file_text({"target": "trtllm", "tp_size": 1})
    assert f"export {ORCHESTRATOR_ENV}=1" in env_file_text({"target": "trtllm", "tp_size": 2, "pp_size": 2})
    # The llmapi model's LLM() spawns its own ranks: no backend orchestrator.
    assert ORCHESTRATOR_ENV not in env_file_text({"target": "trtllm-llmapi", "tp_size": 4})
    assert world_size({"tp_size": 4, "pp_size": 2}) == 8
    with pytest.raises(ValueError, match="tp_size must be a positive integer"):
        world_size({"tp_size": 0})
