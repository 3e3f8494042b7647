"""What ``sluice build-engine`` is asked to build: one ``BuildSpec``, checked when made.

A spec names the source checkpoint in the weight store (``s3://BUCKET/PREFIX``; for a dry run also a local
folder), the registry's model and version, the target (``cpu``, ``trtllm``, ``trtllm-llmapi``) and its
knobs, and where the artifact goes (default ``s3://BUCKET/engines/MODEL/VERSION``, the source's bucket).
``build_config()`` is the JSON the registry's version carries and the artifact's manifest records: with
the source checkpoint's digest and the tool versions it is what makes two builds the same build.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sluice.names import triton_model_name_problem
from sluice.weight_store.uri import S3Uri, parse_s3_uri

Target = Literal["cpu", "trtllm", "trtllm-llmapi"]
TARGETS: tuple[Target, ...] = ("cpu", "trtllm", "trtllm-llmapi")
# Number formats each target accepts; "auto": the CPU engine picks at load (bfloat16 where the CPU has
# it), the TensorRT-LLM targets take the checkpoint's own torch_dtype, float32 made float16 as
# convert_checkpoint.py's own auto does (float16 when it names none). The trtllm engine is built with
# paged context FMHA and served with chunked context, whose kernels are half precision (or FP8): no
# float32 engine.
DTYPES: dict[Target, tuple[str, ...]] = {
    "cpu": ("auto", "float32", "bfloat16"),
    "trtllm": ("auto", "float16", "bfloat16"),
    "trtllm-llmapi": ("auto", "float16", "bfloat16", "float32"),
}
QUANTIZATIONS = ("fp8",)  # ModelOpt FP8 (weights, activations and KV cache), the trtllm target only
# Triton's version folder is the registry's version name: a positive integer without leading zeros.
_TRITON_VERSION = re.compile(r"^[1-9][0-9]{0,8}$")


class BuildInputError(ValueError):
    """An input the build refuses before doing anything (the CLI's exit 2)."""


@dataclass(frozen=True)
class BuildSpec:
    source_uri: str  # s3://BUCKET/PREFIX, or (dry run only) a local checkpoint folder
    model: str
    version: str
    target: Target
    dest_uri: str | None = None  # None: s3://<source bucket>/engines/<model>/<version>
    dtype: str = "auto"
    quantization: str | None = None
    tp_size: int = 1
    pp_size: int = 1
    max_batch_size: int = 64
    max_num_tokens: int = 8192
    max_input_len: int = 4096
    max_seq_len: int = 8192
    # FP8 calibration data: a local folder or s3:// prefix holding a Hugging Face dataset (quantize.py
    # downloads cnn_dailymail from the hub without one; a build job has no outbound internet).
    calib_dataset: str | None = None

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise BuildInputError(f"target must be one of {', '.join(TARGETS)}; got {self.target!r}")
        if self.is_local_source:
            if self.dest_uri is None:
                raise BuildInputError(
                    "--source is a local folder: give --dest (there is no source bucket to default it to)"
                )
        else:
            _uri(self.source_uri, "--source")
        if self.dest_uri is not None:
            _uri(self.dest_uri, "--dest")
        if (problem := triton_model_name_problem(self.model)) is not None:
            raise BuildInputError(problem)
        if not _TRITON_VERSION.match(self.version):
            raise BuildInputError(
                f"version must be a positive integer without leading zeros (Triton's version folder), "
                f"got {self.version!r}"
            )
        if self.dtype not in DTYPES[self.target]:
            choices = ", ".join(DTYPES[self.target])
            raise BuildInputError(f"--dtype for {self.target} must be one of {choices}; got {self.dtype!r}")
        self._check_quantization()
        self._check_limits()

    def _check_quantization(self) -> None:
        if self.quantization is None:
            return
        if self.quantization not in QUANTIZATIONS:
            raise BuildInputError(f"--quantization must be one of {', '.join(QUANTIZATIONS)}")
        if self.target != "trtllm":
            raise BuildInputError(
                f"--quantization {self.quantization} is for the trtllm target (ModelOpt before "
                f"trtllm-build); {self.target} serves the checkpoint's own weights"
            )
        if self.dtype == "float32":
            raise BuildInputError("--quantization fp8 needs --dtype float16, bfloat16 or auto")
        if self.calib_dataset is None:
            raise BuildInputError(
                "--quantization fp8 needs --calib-dataset (a local folder or s3:// prefix with the "
                "calibration set): without one ModelOpt's quantize.py downloads cnn_dailymail from the hub"
            )

    def _check_limits(self) -> None:
        if self.calib_dataset is not None and self.quantization is None:
            raise BuildInputError("--calib-dataset is for --quantization fp8 only")
        for name in (
            "tp_size",
            "pp_size",
            "max_batch_size",
            "max_num_tokens",
            "max_input_len",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BuildInputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.target == "cpu" and self.world_size != 1:
            raise BuildInputError("the cpu target runs on one process: --tp and --pp must be 1")
        if self.max_input_len > self.max_seq_len:
            raise BuildInputError(
                f"--max-input-len ({self.max_input_len}) must not exceed --max-seq-len ({self.max_seq_len})"
            )

    @property
    def is_local_source(self) -> bool:
        return "://" not in self.source_uri  # any URL goes through the store's URI check

    @property
    def local_source(self) -> Path:
        return Path(self.source_uri).expanduser().resolve()

    @property
    def source(self) -> S3Uri:
        return parse_s3_uri(self.source_uri)

    @property
    def world_size(self) -> int:
        """GPUs one replica of this build runs on: tensor x pipeline parallel ranks."""
        return self.tp_size * self.pp_size

    @property
    def dest(self) -> S3Uri:
        """Where the artifact goes."""
        if self.dest_uri is not None:
            return parse_s3_uri(self.dest_uri)
        return parse_s3_uri(f"s3://{self.source.bucket}/engines/{self.model}/{self.version}")

    @property
    def triton_version(self) -> int:
        return int(self.version)

    def build_config(self) -> dict[str, Any]:
        """How the artifact is built: what the registry's version and the manifest record. The cpu
        target's engine limits are the CPU engine's own (the config.pbtxt defaults), so only its dtype."""
        config: dict[str, Any] = {"target": self.target, "dtype": self.dtype}
        if self.target == "cpu":
            return config
        config.update(
            quantization=self.quantization,
            tp_size=self.tp_size,
            pp_size=self.pp_size,
            max_batch_size=self.max_batch_size,
            max_num_tokens=self.max_num_tokens,
            max_input_len=self.max_input_len,
            max_seq_len=self.max_seq_len,
        )
        if self.calib_dataset is not None:
            config["calib_dataset"] = self.calib_dataset
        return config


def _uri(text: str, option: str) -> S3Uri:
    try:
        return parse_s3_uri(text)
    except ValueError as exc:  # InvalidUriError is one
        raise BuildInputError(f"{option}: {exc}") from None
