"""The development stand-in for a Llama Guard model: Sluice's built-in rules as a Triton model.

A thin shell around ``sluice.safety.rules`` (the same classifier the gateway runs in process), so the
gateway's Triton classifier path (``sluice.safety.triton.TritonClassifier``) can be exercised end to end
without a GPU. A production deployment replaces this folder with a Llama Guard model (or an ensemble
that turns its generated "unsafe\\nS1" answer into these two outputs) under the same tensor contract:
input ``text`` (BYTES [1]), outputs ``blocked`` (BOOL [1]) and ``category`` (BYTES [1]).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from sluice.safety.config import load_safety_config
from sluice.safety.rules import RulesClassifier, build_rules


def config_path_from(model_config: dict[str, Any]) -> Path | None:
    value = model_config.get("parameters", {}).get("config_path", {}).get("string_value", "")
    return Path(value) if value else None


def text_from(array: np.ndarray) -> str:
    """The request's one text; ``ValueError`` unless the tensor holds exactly one element."""
    if array.size != 1:
        raise ValueError(f"`text` must hold exactly one string, got {array.size}")
    raw = array.reshape(-1)[0]
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config_path = config_path_from(json.loads(args["model_config"]))
        self._rules: RulesClassifier = build_rules(load_safety_config(config_path))
        pb_utils.Logger.log_info(
            f"safety classifier: {len(self._rules.rules)} rules from {config_path or 'the built-in defaults'}"
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                text = text_from(pb_utils.get_input_tensor_by_name(request, "text").as_numpy())
            except ValueError as exc:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
                continue
            verdict = self._rules.classify_now(text)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("blocked", np.array([verdict.blocked], dtype=np.bool_)),
                        pb_utils.Tensor("category", np.array([verdict.category.encode()], dtype=np.object_)),
                    ]
                )
            )
        return responses
