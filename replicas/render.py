"""Render the CPU engine's Triton model repository from ``model_repository/cpu_engine/``.

    render_model_repository(Path(".sluice/model_repository"), CpuEngineModelSettings(checkpoint_dir=...))

writes ``<out>/<model_name>/config.pbtxt`` (the template with every ``${placeholder}`` filled) and a copy
of every file of the source's version folder ``1/`` (model.py and the modules beside it) as the version
folder ``<model_version>/``, replacing whatever that model folder held before. The config names that one
version (Triton serves no other) and carries the checkpoint's weights digest (``sluice.weights_digest``)
as the parameter ``weights_digest``: a health check reads it back through Triton's model configuration
API, so a replica serving other weights than the registry's version is never routed to.
``python -m replicas.render --out DIR --checkpoint-dir DIR`` does the same from a shell.

``render_safety_classifier(repo, config_path)`` adds the safety classifier model
(``model_repository/safety_classifier/``, the development stand-in for a Llama Guard model) to a
repository the same way.

This runs in the gateway's process (``make run``), so it imports nothing of the CPU engine: the engine's
defaults and checks that the settings need are restated here, and tests/replica/test_render.py fails
if they drift from ``cpu_engine.config.EngineConfig``'s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from string import Template
from typing import Literal

from sluice.names import triton_model_name_problem
from sluice.settings import ITL_TARGET_MS, get_settings
from sluice.weights_digest import check_digest, weights_digest

SOURCE_DIR = Path(__file__).resolve().parents[1] / "model_repository" / "cpu_engine"
SAFETY_SOURCE_DIR = SOURCE_DIR.parent / "safety_classifier"
TEMPLATE_NAME = "config.pbtxt.template"
# The engine's number formats (cpu_engine.config.DTypeSetting): auto picks bfloat16 where the CPU has
# AVX-512 BF16 or AMX-BF16, float32 elsewhere, when the model loads.
DTypeSetting = Literal["auto", "float32", "bfloat16"]
DTYPE_SETTINGS: tuple[DTypeSetting, ...] = ("auto", "float32", "bfloat16")


def fill_template(template: str, values: Mapping[str, object]) -> str:
    """Substitute ``${key}`` placeholders; refuse keys the template lacks and placeholders left unfilled.

    Values are written inside pbtxt strings or as numbers, so quotes, backslashes and newlines are refused.
    """
    tmpl = Template(template)
    if not tmpl.is_valid():
        raise ValueError("the template has a malformed placeholder")
    wanted = set(tmpl.get_identifiers())
    unknown = sorted(set(values) - wanted)
    missing = sorted(wanted - set(values))
    if unknown:
        raise ValueError(f"keys not in the template: {', '.join(unknown)}")
    if missing:
        raise ValueError(f"placeholders without a value: {', '.join(missing)}")
    text = {k: str(v) for k, v in values.items()}
    for key, value in text.items():
        if any(c in value for c in '"\\\n'):
            raise ValueError(f"value for {key!r} must not contain quotes, backslashes or newlines")
    return tmpl.substitute(text)


@dataclass(frozen=True)
class CpuEngineModelSettings:
    """Everything the template asks for. The engine's knobs default to ``EngineConfig``'s values."""

    checkpoint_dir: Path
    model_name: str = "sluice-tiny"
    # Triton's version folder: a positive integer (the registry's version name for a Triton-served model).
    model_version: int = 1
    # "sha256:<hex>" of the checkpoint; None: computed from checkpoint_dir when rendered.
    weights_digest: str | None = None
    # Requests Triton may hand to one execute() call (not a token batch: the engine batches by itself).
    max_batch_size: int = 64
    num_kv_blocks: int = 2048
    block_size_tokens: int = 16
    step_token_budget: int = 512
    max_num_running: int = 256
    dtype: DTypeSetting = "auto"
    kv_cache_dtype: DTypeSetting = "auto"
    # The inter-token target (SLUICE_ITL_TARGET_MS) in two halves: a step's time (the running cap shrinks
    # while steps take longer; None: no cap) and how long a stream's tokens may wait to leave together.
    target_step_ms: float | None = ITL_TARGET_MS / 2
    send_budget_ms: float = ITL_TARGET_MS / 2
    # A stream's tokens wait at all only while the live streams would make more responses a second than this.
    max_responses_per_s: float = 1000.0
    # A step with prefill takes at most about this many decode-only steps; None: prefill fills the budget.
    prefill_step_stretch: float | None = 2.0
    # OpenMP threads of a step with prefill ("auto": every CPU of the model's process; None: the
    # server's OMP_NUM_THREADS for every step).
    prefill_num_threads: int | Literal["auto"] | None = "auto"
    stats_interval_ms: float = 100.0
    # Each live request is asked about once per this period (a rotating slice per pass: each ask is an IPC
    # round trip); 0: every request once per engine step. 40 measured less send-path delay under a flood.
    cancellation_check_period_ms: float = 40.0
    # While higher-priority work is live, a lower-priority stream is sent at most this often; 0: never held.
    yield_send_interval_ms: float = 50.0

    def __post_init__(self) -> None:
        if (problem := triton_model_name_problem(self.model_name)) is not None:
            raise ValueError(problem)
        if (
            isinstance(self.model_version, bool)
            or not isinstance(self.model_version, int)
            or self.model_version < 1
        ):
            raise ValueError(
                f"model_version must be a positive integer (Triton's version folder), "
                f"got {self.model_version!r}"
            )
        if self.weights_digest is not None:
            check_digest(self.weights_digest)
        if self.max_batch_size < 1 or self.stats_interval_ms <= 0:
            raise ValueError("max_batch_size and stats_interval_ms must be positive")
        if self.cancellation_check_period_ms < 0 or self.yield_send_interval_ms < 0:
            raise ValueError("cancellation_check_period_ms and yield_send_interval_ms must be >= 0")
        if self.target_step_ms is not None and self.target_step_ms <= 0:
            raise ValueError("target_step_ms must be positive when set")
        if self.send_budget_ms < 0 or self.max_responses_per_s <= 0:
            raise ValueError("send_budget_ms must be >= 0 and max_responses_per_s > 0")
        self._check_engine_knobs()

    def _check_engine_knobs(self) -> None:
        """``EngineConfig``'s checks of the knobs rendered here, with its messages: a bad value fails at
        render time rather than when the model loads."""
        for name, value in (("dtype", self.dtype), ("kv_cache_dtype", self.kv_cache_dtype)):
            if value not in DTYPE_SETTINGS:
                raise ValueError(f"{name} must be one of {', '.join(DTYPE_SETTINGS)}; got {value!r}")
        if self.block_size_tokens <= 0 or self.num_kv_blocks <= 0:
            raise ValueError("block_size_tokens and num_kv_blocks must be positive")
        if self.step_token_budget < 1 or self.max_num_running < 1:
            raise ValueError("step_token_budget and max_num_running must be at least 1")
        stretch = self.prefill_step_stretch
        if stretch is not None and not stretch >= 1.0:
            raise ValueError(f"prefill_step_stretch must be >= 1 or None; got {stretch!r}")
        threads = self.prefill_num_threads
        if threads not in (None, "auto") and not (isinstance(threads, int) and 1 <= threads <= 1024):
            raise ValueError(f"prefill_num_threads must be 'auto', None or in [1, 1024]; got {threads!r}")

    def template_values(self) -> dict[str, str]:
        values = {k: str(v) for k, v in asdict(self).items()}
        values["checkpoint_dir"] = str(Path(self.checkpoint_dir).resolve())
        values["weights_digest"] = self.weights_digest or weights_digest(Path(self.checkpoint_dir))
        values["target_step_ms"] = "" if self.target_step_ms is None else str(self.target_step_ms)
        stretch = self.prefill_step_stretch
        values["prefill_step_stretch"] = "" if stretch is None else str(stretch)
        threads = self.prefill_num_threads
        values["prefill_num_threads"] = "" if threads is None else str(threads)
        return values


def render_model_repository(
    out_dir: Path, settings: CpuEngineModelSettings, source_dir: Path = SOURCE_DIR
) -> Path:
    """Write the model folder under ``out_dir`` and return it. The folder is swapped in whole."""
    config = fill_template((source_dir / TEMPLATE_NAME).read_text(), settings.template_values())
    return _write_model(out_dir, settings.model_name, config, source_dir, settings.model_version)


def render_safety_classifier(
    repo_dir: Path,
    config_path: Path | None,
    model_name: str = "sluice-guard",
    source_dir: Path = SAFETY_SOURCE_DIR,
) -> Path:
    """Write the safety classifier's model folder under ``repo_dir`` and return it. ``config_path`` is the
    safety config the model loads (the JSON of ``SLUICE_SAFETY_CONFIG``); None: the built-in PII rules."""
    if (problem := triton_model_name_problem(model_name)) is not None:
        raise ValueError(problem)
    if config_path is not None and not Path(config_path).is_file():
        raise ValueError(f"safety config {config_path} is not a file")
    values = {
        "model_name": model_name,
        "config_path": "" if config_path is None else str(Path(config_path).resolve()),
    }
    config = fill_template((source_dir / TEMPLATE_NAME).read_text(), values)
    return _write_model(repo_dir, model_name, config, source_dir)


def _write_model(out_dir: Path, model_name: str, config: str, source_dir: Path, version: int = 1) -> Path:
    """Swap in ``out_dir/model_name`` holding ``config.pbtxt`` and a copy of ``source_dir/1`` as the version
    folder ``version``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / model_name
    staging = Path(tempfile.mkdtemp(prefix=f".{model_name}.", dir=out_dir))
    try:
        (staging / "config.pbtxt").write_text(config)
        # Everything: model.py imports the modules beside it. Not bytecode or tool caches (this machine's).
        caches = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")
        shutil.copytree(source_dir / "1", staging / str(version), ignore=caches)
        staging.chmod(0o755)  # mkdtemp makes it 0700
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


# --target-step-ms not given (its value may be None: 'none').
_UNSET: object = object()


def optional_float(text: str) -> float | None:
    """A number, or None for 'none' or '' (how the command line turns an optional knob off)."""
    return None if text.strip().lower() in ("", "none") else float(text)


def _optional_threads(text: str) -> int | Literal["auto"] | None:
    """A thread count, 'auto', or None for 'none' or ''."""
    lowered = text.strip().lower()
    if lowered == "auto":
        return "auto"
    return None if lowered in ("", "none") else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render the Triton model repository: the CPU engine and the safety classifier."
    )
    parser.add_argument("--out", required=True, type=Path, help="model repository folder to write into")
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--model-name", default=CpuEngineModelSettings.model_name)
    parser.add_argument(
        "--model-version",
        type=int,
        default=CpuEngineModelSettings.model_version,
        help="Triton's version folder",
    )
    parser.add_argument("--num-kv-blocks", type=int, default=CpuEngineModelSettings.num_kv_blocks)
    parser.add_argument("--block-size-tokens", type=int, default=CpuEngineModelSettings.block_size_tokens)
    parser.add_argument("--step-token-budget", type=int, default=CpuEngineModelSettings.step_token_budget)
    parser.add_argument("--max-num-running", type=int, default=CpuEngineModelSettings.max_num_running)
    parser.add_argument(
        "--itl-target-ms",
        type=float,
        default=None,
        help="the inter-token target the replica keeps (default: SLUICE_ITL_TARGET_MS): half of it bounds "
        "a step (the running cap shrinks above it), half how long a stream's tokens wait to leave together",
    )
    parser.add_argument(
        "--target-step-ms", type=optional_float, default=_UNSET, help="override ('none': no cap)"
    )
    parser.add_argument("--send-budget-ms", type=float, default=None, help="override (0: each token at once)")
    parser.add_argument(
        "--max-responses-per-s",
        type=float,
        default=CpuEngineModelSettings.max_responses_per_s,
        help="streams wait to leave together only while they would make more responses a second than this",
    )
    parser.add_argument(
        "--prefill-step-stretch",
        type=optional_float,
        default=CpuEngineModelSettings.prefill_step_stretch,
        help="a step with prefill takes at most about this many decode-only steps ('none': no limit)",
    )
    parser.add_argument(
        "--prefill-num-threads",
        type=_optional_threads,
        default=CpuEngineModelSettings.prefill_num_threads,
        help="OpenMP threads of a step with prefill ('auto': every CPU; 'none': OMP_NUM_THREADS for all)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_SETTINGS,
        default=None,
        help="the engine's number format (default: SLUICE_ENGINE_DTYPE, else auto)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=DTYPE_SETTINGS,
        default=CpuEngineModelSettings.kv_cache_dtype,
        help="the KV cache's number format (auto: bfloat16, unless --dtype is float32)",
    )
    parser.add_argument(
        "--cancellation-check-period-ms",
        type=float,
        default=CpuEngineModelSettings.cancellation_check_period_ms,
        help="ask each live request whether it was cancelled about this often (0: every request every step)",
    )
    parser.add_argument(
        "--yield-send-interval-ms",
        type=float,
        default=CpuEngineModelSettings.yield_send_interval_ms,
        help="while higher-priority work is live, send lower-priority streams at most this often (0: never)",
    )
    parser.add_argument(
        "--safety-classifier",
        metavar="NAME",
        default="sluice-guard",
        help="also render the safety classifier model under this name ('' for none)",
    )
    parser.add_argument("--safety-config", type=Path, default=None, help="the classifier's rules (JSON)")
    args = parser.parse_args(argv)
    try:
        settings = _model_settings(args)
    except ValueError as exc:  # SettingsError is one: a bad SLUICE_* variable
        parser.error(str(exc))
    print(render_model_repository(args.out, settings))
    if args.safety_classifier:
        print(render_safety_classifier(args.out, args.safety_config, args.safety_classifier))
    return 0


def _model_settings(args: argparse.Namespace) -> CpuEngineModelSettings:
    itl_target_ms = args.itl_target_ms if args.itl_target_ms is not None else get_settings().itl_target_ms
    # NOTE: argparse cannot tell "--target-step-ms none" from no flag: the sentinel below can.
    target_step_ms = itl_target_ms / 2 if args.target_step_ms is _UNSET else args.target_step_ms
    return CpuEngineModelSettings(
        checkpoint_dir=args.checkpoint_dir,
        model_name=args.model_name,
        model_version=args.model_version,
        num_kv_blocks=args.num_kv_blocks,
        block_size_tokens=args.block_size_tokens,
        step_token_budget=args.step_token_budget,
        max_num_running=args.max_num_running,
        target_step_ms=target_step_ms,
        send_budget_ms=itl_target_ms / 2 if args.send_budget_ms is None else args.send_budget_ms,
        max_responses_per_s=args.max_responses_per_s,
        prefill_step_stretch=args.prefill_step_stretch,
        prefill_num_threads=args.prefill_num_threads,
        dtype=args.dtype or get_settings().engine_dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        cancellation_check_period_ms=args.cancellation_check_period_ms,
        yield_send_interval_ms=args.yield_send_interval_ms,
    )


if __name__ == "__main__":
    sys.exit(main())
