"""The limits a TensorRT-LLM engine was built with, as the registry version records them and the gateway
enforces them before dispatch.

The executor refuses a prompt longer than the engine's ``max_input_len`` with an INTERNAL error and
stops generation at ``max_seq_len`` (prompt + output), whatever the model's ``max_position_embeddings``
allows; so a request over either must be a 400 ``context_length_exceeded`` at the gateway, never a 5xx
from the replica. ``sluice build-engine`` reads them from the engine's own ``config.json`` (trtllm-build
writes ``{"version", "pretrained_config", "build_config"}``: tensorrt_llm/builder.py,
``EngineConfig.to_dict`` and ``Engine.save``) and records them under ``build_config["engine_limits"]``.
Imports nothing of Sluice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BUILD_CONFIG_KEY = "engine_limits"  # where a registry version's build config carries them
ENGINE_CONFIG_FILE = "config.json"  # trtllm-build's, beside rank<N>.engine


@dataclass(frozen=True)
class EngineLimits:
    max_input_len: int  # the longest prompt, in tokens
    max_seq_len: int  # prompt + output, in tokens
    max_batch_size: int  # requests in flight at once
    max_num_tokens: int  # tokens in one engine step (chunked context splits longer prompts)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str) -> EngineLimits:
        """ValueError naming ``where`` and the field when one is missing or not a positive integer."""
        values: dict[str, int] = {}
        for name in cls.__dataclass_fields__:
            value = raw.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {name} must be a positive integer, got {value!r}")
            values[name] = value
        limits = cls(**values)
        if limits.max_input_len > limits.max_seq_len:
            raise ValueError(
                f"{where}: max_input_len {limits.max_input_len} exceeds max_seq_len {limits.max_seq_len}"
            )
        return limits

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def limits_of(build_config: Mapping[str, Any] | None) -> EngineLimits | None:
    """A version's engine limits; None when its build config records none (the CPU engine: bounded by
    its model's context). ValueError when they are recorded but malformed."""
    raw = (build_config or {}).get(BUILD_CONFIG_KEY)
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValueError(f"build_config.{BUILD_CONFIG_KEY} must be an object, got {type(raw).__name__}")
    return EngineLimits.from_mapping(raw, f"build_config.{BUILD_CONFIG_KEY}")


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    """trtllm-build's ``config.json`` in ``engine_dir`` (ValueError if missing or not that shape)."""
    path = engine_dir / ENGINE_CONFIG_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: missing (trtllm-build writes it beside the engine)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("build_config"), dict):
        raise ValueError(f"{path}: no build_config object (not a trtllm-build engine config)")
    return raw


def read_engine_limits(engine_dir: Path) -> EngineLimits:
    """The limits the engine in ``engine_dir`` was built with, from its ``config.json``."""
    raw = read_engine_config(engine_dir)
    return EngineLimits.from_mapping(raw["build_config"], str(engine_dir / ENGINE_CONFIG_FILE))
