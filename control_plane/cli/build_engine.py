"""``sluice build-engine``: turn a checkpoint in the weight store into a staged registry version.

    sluice build-engine --source s3://weights/checkpoints/sluice-tiny --model sluice-tiny --version 2 \\
        --target cpu

fetches and checks the checkpoint, builds what the target needs (``build_engines``), uploads the artifact
with its manifest to ``s3://BUCKET/engines/MODEL/VERSION`` (``--dest`` to choose) and registers the
version ``staged`` through the admin API (release-manager), with its weights digest and build config.
``--dry-run`` prints the plan (steps, exact commands, rendered configurations) and changes nothing; with a
local checkpoint folder as ``--source`` (and ``--offline`` to insist on it) it contacts no weight store
and no registry.

Exit codes: 0 done (or nothing to do); 1 the build failed or was refused by the store or the registry;
2 a usage error, or a target this machine cannot run (the TensorRT-LLM targets without a GPU).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from build_engines.checkpoint import CheckpointError
from build_engines.pipeline import (
    DEFAULT_TRTLLM_EXAMPLES,
    BuildConflict,
    BuildRefused,
    run_build,
)
from build_engines.spec import DTYPES, QUANTIZATIONS, TARGETS, BuildInputError, BuildSpec
from build_engines.trtllm_release import TRITON_IMAGE_REF, TRTLLM_VERSION
from control_plane.cli.admin_client import AdminApi, AdminApiError, add_connection_options
from control_plane.cli.admin_commands import EXIT_FAILED, EXIT_OK, EXIT_USAGE, fail, model_path, positive_int
from sluice.settings import SettingsError, load_settings
from sluice.weight_store import WeightStore, WeightStoreError

# Options only the TensorRT-LLM targets take (the CPU engine's limits are its model config's).
_TRTLLM_ONLY = (
    "quantization",
    "calib_dataset",
    "tp",
    "pp",
    "max_batch_size",
    "max_num_tokens",
    "max_input_len",
    "max_seq_len",
)
_DEFAULTS = {
    "tp": 1,
    "pp": 1,
    "max_batch_size": 64,
    "max_num_tokens": 8192,
    "max_input_len": 4096,
    "max_seq_len": 8192,
}


class AdminRegistrar:
    """The registry through the admin API, as ``build_engines.pipeline.Registrar``."""

    def __init__(self, api: AdminApi) -> None:
        self.api = api

    def require_model(self, model: str) -> None:
        try:
            self.api.call("GET", f"/models/{model_path(model)}")
        except AdminApiError as exc:
            if exc.status_code == 404:
                raise BuildRefused(
                    f"model {model!r} is not in the registry: `sluice models create {model}` first"
                ) from None
            raise

    def registered_version(self, model: str, version: str) -> Mapping[str, Any] | None:
        listing = self.api.call("GET", f"/models/{model_path(model)}/versions")
        found: Mapping[str, Any] | None = next(
            (v for v in listing["versions"] if v["version"] == version), None
        )
        return found

    def add_version(
        self, model: str, version: str, artifact_uri: str, digest: str, build_config: Mapping[str, Any]
    ) -> None:
        body = {
            "version": version,
            "artifact_uri": artifact_uri,
            "weights_digest": digest,
            "build_config": dict(build_config),
        }
        self.api.call("POST", f"/models/{model_path(model)}/versions", body)


def _spec(args: argparse.Namespace, engine_dtype: str) -> BuildSpec:
    if args.target == "cpu":
        given = [f"--{name.replace('_', '-')}" for name in _TRTLLM_ONLY if getattr(args, name) is not None]
        if given:
            raise BuildInputError(
                f"{', '.join(given)}: for the trtllm targets only (the CPU engine has its own)"
            )
    limits = {name: getattr(args, name) or default for name, default in _DEFAULTS.items()}
    return BuildSpec(
        source_uri=args.source,
        model=args.model,
        version=args.version,
        target=args.target,
        dest_uri=args.dest,
        dtype=args.dtype or (engine_dtype if args.target == "cpu" else "auto"),
        quantization=args.quantization,
        calib_dataset=args.calib_dataset,
        tp_size=limits["tp"],
        pp_size=limits["pp"],
        max_batch_size=limits["max_batch_size"],
        max_num_tokens=limits["max_num_tokens"],
        max_input_len=limits["max_input_len"],
        max_seq_len=limits["max_seq_len"],
    )


def _check_offline(args: argparse.Namespace, spec: BuildSpec) -> None:
    if args.offline and not (args.dry_run and spec.is_local_source):
        raise BuildInputError(
            "--offline previews a build without any store or registry: it needs --dry-run and a local "
            "checkpoint folder as --source"
        )


def _build(args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
        spec = _spec(args, settings.engine_dtype)
        _check_offline(args, spec)
    except (SettingsError, BuildInputError) as exc:
        return fail(str(exc), EXIT_USAGE)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="sluice-build-"))
    try:
        result = run_build(
            spec,
            store=None if spec.is_local_source else WeightStore.from_settings(settings),
            registrar=AdminRegistrar(AdminApi.from_args(args, settings)),
            work_dir=work_dir,
            dry_run=args.dry_run,
            trtllm_examples=args.trtllm_examples,
        )
    except BuildRefused as exc:
        return fail(str(exc), EXIT_USAGE)
    except (BuildConflict, CheckpointError, WeightStoreError, AdminApiError) as exc:
        return fail(str(exc), EXIT_FAILED)
    except subprocess.CalledProcessError as exc:
        return fail(f"step failed: {' '.join(map(str, exc.cmd))} exited with {exc.returncode}", EXIT_FAILED)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    if result.built:
        print(f"Built {spec.model}@{spec.version} ({spec.target}): {result.artifact_uri}")
    if result.registered:
        print(f"Next: `sluice versions set-state {spec.model} {spec.version} warming` so replicas load it.")
    return EXIT_OK


def register(parser: argparse.ArgumentParser) -> None:
    """The options of ``sluice build-engine`` (one command, no subcommands)."""
    parser.add_argument(
        "--source",
        required=True,
        help="the checkpoint in the weight store: s3://BUCKET/PREFIX (for --dry-run also a local folder)",
    )
    parser.add_argument("--model", required=True, help="the registry's model (create it first)")
    parser.add_argument("--version", required=True, help="the version to register: a positive integer")
    parser.add_argument(
        "--target",
        required=True,
        choices=TARGETS,
        help=f"cpu: the CPU engine; trtllm: a TensorRT-LLM {TRTLLM_VERSION} engine ({TRITON_IMAGE_REF}); "
        "trtllm-llmapi: its PyTorch backend",
    )
    parser.add_argument(
        "--dest",
        default=None,
        help="where the artifact goes (default: s3://<source bucket>/engines/MODEL/VERSION)",
    )
    dtypes = sorted({d for choices in DTYPES.values() for d in choices})
    parser.add_argument(
        "--dtype",
        choices=dtypes,
        default=None,
        help="cpu: auto|float32|bfloat16 (default SLUICE_ENGINE_DTYPE, else auto); trtllm: "
        "auto (the checkpoint's own, float32 made float16)|float16|bfloat16; trtllm-llmapi: also float32",
    )
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default=None, help="trtllm: ModelOpt FP8")
    parser.add_argument(
        "--calib-dataset",
        default=None,
        help="--quantization fp8: the calibration set, a local folder or s3:// prefix (required: "
        "quantize.py would otherwise download cnn_dailymail from the hub)",
    )
    parser.add_argument("--tp", type=positive_int, default=None, help="tensor-parallel GPUs (default 1)")
    parser.add_argument("--pp", type=positive_int, default=None, help="pipeline-parallel stages (default 1)")
    for name, default in _DEFAULTS.items():
        if name not in ("tp", "pp"):
            flag = f"--{name.replace('_', '-')}"
            parser.add_argument(
                flag, type=positive_int, default=None, help=f"trtllm targets (default {default})"
            )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan; build, upload, register nothing"
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="with --dry-run and a local --source: contact no weight store and no registry",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="scratch folder, kept (default: a temporary one)"
    )
    parser.add_argument(
        "--trtllm-examples",
        type=Path,
        default=DEFAULT_TRTLLM_EXAMPLES,
        help=f"TensorRT-LLM {TRTLLM_VERSION}'s examples/ folder (convert_checkpoint.py, "
        f"quantization/quantize.py; default {DEFAULT_TRTLLM_EXAMPLES}, the build-engine image's)",
    )
    add_connection_options(parser)
    parser.set_defaults(handler=_build)
