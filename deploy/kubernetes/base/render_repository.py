"""The replica's render init container: the Triton repository for the artifact the fetch init container
put in the node's cache (its folder path in ARTIFACT_DIR_FILE), for MODEL_NAME version MODEL_VERSION,
with BUILD_CONFIG_JSON (the registry version's build config: its ``target`` picks the Triton model) and,
when set, WEIGHTS_DIGEST checked against the artifact before anything is written. It also writes
TRITON_ENV_FILE, which the triton container sources before ``exec tritonserver`` (orchestrator mode for a
tp x pp > 1 engine: build_engines.replica_launch), and refuses when GPU_COUNT (the pod's
nvidia.com/gpu, written beside it in the manifest) is not the build's tp x pp. LLMAPI_MODEL_DIR: the
release's llmapi model.py and helpers.py (default: where the control-plane image keeps them).
Exit 1 with the reason.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from build_engines.replica_launch import env_file_text, world_size
from build_engines.repository import render_for_replica
from build_engines.trtllm_release import LLMAPI_MODEL_DIR


def main() -> int:
    artifact_dir = Path(Path(os.environ["ARTIFACT_DIR_FILE"]).read_text().strip())
    try:
        build_config = json.loads(os.environ.get("BUILD_CONFIG_JSON") or "{}") or None
        gpus = world_size(build_config)
        if int(os.environ.get("GPU_COUNT", gpus)) != gpus:
            raise ValueError(
                f"the build runs on tp x pp = {gpus} GPUs, this pod requests {os.environ['GPU_COUNT']}"
            )
        model_dir = render_for_replica(
            artifact_dir,
            Path(os.environ["REPOSITORY_DIR"]),
            os.environ["MODEL_NAME"],
            os.environ["MODEL_VERSION"],
            build_config,
            expected_digest=os.environ.get("WEIGHTS_DIGEST") or None,
            llmapi_model_dir=Path(os.environ.get("LLMAPI_MODEL_DIR") or LLMAPI_MODEL_DIR),
        )
        env_file = os.environ.get("TRITON_ENV_FILE")
        if env_file:
            Path(env_file).write_text(env_file_text(build_config))
    except (ValueError, KeyError, OSError) as exc:
        print(f"render-repository: {exc}", file=sys.stderr)
        return 1
    print(f"render-repository: {model_dir} from {artifact_dir} ({gpus} GPU)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
