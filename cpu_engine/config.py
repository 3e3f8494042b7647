"""Typed configuration: the model's shape (read from a Hugging Face config.json) and the engine's knobs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# A number format: for the linear layers, "bfloat16" (weights and activations rounded to bf16, float32
# accumulation, about 3x the speed on CPUs with AVX-512 BF16) or "float32" (numpy/BLAS: numerically the
# reference, which the parity tests against transformers use); for the KV cache, keys and values stored
# as bf16 (half the bytes attention reads and half the memory a block takes, math still float32) or as
# float32.
LinearDType = Literal["float32", "bfloat16"]
# What a configuration may ask for: a LinearDType, or "auto": bfloat16 where the CPU has AVX-512 BF16 or
# AMX-BF16 (and the kernel was built for it), float32 elsewhere, where the portable bf16 path is slower
# than float32 (cpu_engine/cpu_features.py decides; LLMEngine.dtype_choice says what it chose and why).
DTypeSetting = Literal["auto", "float32", "bfloat16"]
DTYPE_SETTINGS: tuple[DTypeSetting, ...] = ("auto", "float32", "bfloat16")


def prefill_num_threads_of(setting: str) -> int | None:
    """The team a step with prefill runs on (``EngineConfig.prefill_num_threads``) from the replica's
    ``prefill_num_threads`` setting: "auto" is every CPU this process may run on, "" None (every step on the
    team the server started with), else the integer it names (ValueError if it names none)."""
    if setting == "auto":
        return len(os.sched_getaffinity(0))
    return int(setting) if setting else None


def check_dtype_setting(value: str, name: str = "dtype") -> DTypeSetting:
    """``value`` if it is one of DTYPE_SETTINGS, else ValueError naming the setting and the allowed values."""
    if value not in DTYPE_SETTINGS:
        raise ValueError(f"{name} must be one of {', '.join(DTYPE_SETTINGS)}; got {value!r}")
    return value


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a Llama-family checkpoint (LlamaForCausalLM and look-alikes)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        archs = raw.get("architectures") or ["LlamaForCausalLM"]
        if raw.get("model_type", "llama") not in ("llama", "mistral") and "LlamaForCausalLM" not in archs:
            raise ValueError(f"unsupported architecture {archs!r} (model_type={raw.get('model_type')!r})")
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        # transformers v5 folds rope_theta and the scaling into "rope_parameters"; v4 files keep them apart.
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        rope_theta = float(raw.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = None if rope_type == "default" else rope
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        window = raw.get("sliding_window")
        max_positions = int(raw.get("max_position_embeddings", 2048))
        if window and raw.get("use_sliding_window", True) and int(window) < max_positions:
            raise ValueError("sliding-window attention is not supported by the CPU engine")
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=num_heads,
            num_key_value_heads=int(raw.get("num_key_value_heads", num_heads)),
            head_dim=int(raw.get("head_dim") or hidden // num_heads),
            max_position_embeddings=max_positions,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> ModelConfig:
        return cls.from_dict(json.loads((Path(path) / "config.json").read_text()))

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token occupies across all layers with float32 keys and values (half
        that in a bfloat16 cache: ``EngineConfig.kv_cache_dtype``)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 4


@dataclass
class EngineConfig:
    """Knobs of the step loop. Budgets are in tokens, sizes in blocks, times in milliseconds."""

    # Number format of the linear layers (see LinearDType and DTypeSetting).
    dtype: DTypeSetting = "auto"
    # Number format of the KV cache; "auto": bfloat16 on every CPU, unless ``dtype`` is set to float32
    # explicitly (the reference), which it then follows (cpu_engine/cpu_features.py, choose_kv_cache_dtype).
    kv_cache_dtype: DTypeSetting = "auto"
    block_size_tokens: int = 16
    num_kv_blocks: int = 2048
    # Tokens processed per step (decode tokens + prefill chunks): bounds one step's time.
    step_token_budget: int = 512
    max_num_running: int = 256
    # Fraction of the pool held back at admission so running sequences can grow before preemption.
    watermark_fraction: float = 0.01
    enable_prefix_cache: bool = True
    # Adaptive batch: when set, cap running sequences so the measured step time stays under this target.
    target_step_ms: float | None = None
    # While sequences decode, a step's prefill chunks are cut so the step takes at most about this many
    # times a decode-only step (a ratio; step costs learned from measured steps, at least one block of
    # prefill per step). With nothing decoding, prefill takes the whole budget. None: always the whole
    # budget left after decodes (cpu_engine/prefill_budget.py).
    prefill_step_stretch: float | None = 2.0
    # A step with at least parallel_prefill_min_tokens prompt tokens runs its kernels on this many OpenMP
    # threads; every other step on the team the stepping thread started with (OMP_NUM_THREADS). Prefill
    # is large matrix products that split well, and a burst of prompts leaves the serving path idle,
    # while decode steps share the cores with it. None: every step on the starting team.
    prefill_num_threads: int | None = None
    parallel_prefill_min_tokens: int = 256
    # Step-time histogram bucket bounds (ms) exported in stats.
    step_ms_buckets: tuple[float, ...] = field(default=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024))

    def __post_init__(self) -> None:
        check_dtype_setting(self.dtype)
        check_dtype_setting(self.kv_cache_dtype, "kv_cache_dtype")
        if self.block_size_tokens <= 0 or self.num_kv_blocks <= 0:
            raise ValueError("block_size_tokens and num_kv_blocks must be positive")
        if self.step_token_budget < 1 or self.max_num_running < 1:
            raise ValueError("step_token_budget and max_num_running must be at least 1")
        if not 0.0 <= self.watermark_fraction < 1.0:
            raise ValueError("watermark_fraction must be in [0, 1)")
        if self.prefill_step_stretch is not None and not self.prefill_step_stretch >= 1.0:
            raise ValueError(f"prefill_step_stretch must be >= 1 or None; got {self.prefill_step_stretch!r}")
        if self.prefill_num_threads is not None and not 1 <= self.prefill_num_threads <= 1024:
            raise ValueError(
                f"prefill_num_threads must be in [1, 1024] or None; got {self.prefill_num_threads!r}"
            )
        if self.parallel_prefill_min_tokens < 1:
            raise ValueError("parallel_prefill_min_tokens must be at least 1")
