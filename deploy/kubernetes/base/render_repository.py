"""The replica's render init container: the Triton repository for the artifact the fetch init container
put in the node's cache (its folder path in ARTIFACT_DIR_FILE), for MODEL_NAME version MODEL_VERSION,
with BUILD_CONFIG_JSON (the registry version's build config: its ``target`` picks the Triton model) and,
when set, WEIGHTS_DIGEST checked against the artifact before anything is written. Exit 1 with the reason.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from build_engines.repository import render_for_replica


def main() -> int:
    artifact_dir = Path(Path(os.environ["ARTIFACT_DIR_FILE"]).read_text().strip())
    try:
        model_dir = render_for_replica(
            artifact_dir,
            Path(os.environ["REPOSITORY_DIR"]),
            os.environ["MODEL_NAME"],
            os.environ["MODEL_VERSION"],
            json.loads(os.environ.get("BUILD_CONFIG_JSON") or "{}") or None,
            expected_digest=os.environ.get("WEIGHTS_DIGEST") or None,
        )
    except (ValueError, KeyError, OSError) as exc:
        print(f"render-repository: {exc}", file=sys.stderr)
        return 1
    print(f"render-repository: {model_dir} from {artifact_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
