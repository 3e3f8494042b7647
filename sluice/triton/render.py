"""Render the CPU engine's Triton model repository from ``model_repository/cpu_engine/``.

    render_model_repository(Path(".sluice/model_repository"), CpuEngineModelSettings(checkpoint_dir=...))

writes ``<out>/<model_name>/config.pbtxt`` (the template with every ``${placeholder}`` filled) and
``<out>/<model_name>/1/model.py``, replacing whatever that model folder held before.
``python -m sluice.triton.render --out DIR --checkpoint-dir DIR`` does the same from a shell.

``render_safety_classifier(repo, config_path)`` adds the safety classifier model
(``model_repository/safety_classifier/``, the development stand-in for a Llama Guard model) to a
repository the same way.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from string import Template

from cpu_engine.config import DTYPE_SETTINGS, DTypeSetting, EngineConfig
from sluice.settings import get_settings

SOURCE_DIR = Path(__file__).resolve().parents[2] / "model_repository" / "cpu_engine"
SAFETY_SOURCE_DIR = SOURCE_DIR.parent / "safety_classifier"
TEMPLATE_NAME = "config.pbtxt.template"
_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


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
    """Everything the template asks for. Engine defaults are ``EngineConfig``'s."""

    checkpoint_dir: Path
    model_name: str = "sluice-tiny"
    # Requests Triton may hand to one execute() call (not a token batch: the engine batches by itself).
    max_batch_size: int = 64
    num_kv_blocks: int = EngineConfig.num_kv_blocks
    block_size_tokens: int = EngineConfig.block_size_tokens
    step_token_budget: int = EngineConfig.step_token_budget
    max_num_running: int = EngineConfig.max_num_running
    # auto: bfloat16 where the CPU has AVX-512 BF16 or AMX-BF16, float32 elsewhere (decided at load).
    dtype: DTypeSetting = EngineConfig.dtype
    target_step_ms: float | None = None
    # A step with prefill takes at most about this many decode-only steps; None: prefill fills the budget.
    prefill_step_stretch: float | None = EngineConfig.prefill_step_stretch
    stats_interval_ms: float = 100.0
    # Each live request is asked about once per this period (a rotating slice per pass: each ask is an IPC
    # round trip); 0: every request once per engine step. 40 measured less send-path delay under a flood.
    cancellation_check_period_ms: float = 40.0
    # While higher-priority work is live, a lower-priority stream is sent at most this often; 0: never held.
    yield_send_interval_ms: float = 50.0

    def __post_init__(self) -> None:
        if not _MODEL_NAME_RE.match(self.model_name):
            raise ValueError(f"model name must match {_MODEL_NAME_RE.pattern}, got {self.model_name!r}")
        if self.max_batch_size < 1 or self.stats_interval_ms <= 0:
            raise ValueError("max_batch_size and stats_interval_ms must be positive")
        if self.cancellation_check_period_ms < 0 or self.yield_send_interval_ms < 0:
            raise ValueError("cancellation_check_period_ms and yield_send_interval_ms must be >= 0")
        if self.target_step_ms is not None and self.target_step_ms <= 0:
            raise ValueError("target_step_ms must be positive when set")
        EngineConfig(  # the engine's own checks, at render time rather than at model load
            dtype=self.dtype,
            block_size_tokens=self.block_size_tokens,
            num_kv_blocks=self.num_kv_blocks,
            step_token_budget=self.step_token_budget,
            max_num_running=self.max_num_running,
            prefill_step_stretch=self.prefill_step_stretch,
        )

    def template_values(self) -> dict[str, str]:
        values = {k: str(v) for k, v in asdict(self).items()}
        values["checkpoint_dir"] = str(Path(self.checkpoint_dir).resolve())
        values["target_step_ms"] = "" if self.target_step_ms is None else str(self.target_step_ms)
        stretch = self.prefill_step_stretch
        values["prefill_step_stretch"] = "" if stretch is None else str(stretch)
        return values


def render_model_repository(
    out_dir: Path, settings: CpuEngineModelSettings, source_dir: Path = SOURCE_DIR
) -> Path:
    """Write the model folder under ``out_dir`` and return it. The folder is swapped in whole."""
    config = fill_template((source_dir / TEMPLATE_NAME).read_text(), settings.template_values())
    return _write_model(out_dir, settings.model_name, config, source_dir)


def render_safety_classifier(
    repo_dir: Path,
    config_path: Path | None,
    model_name: str = "sluice-guard",
    source_dir: Path = SAFETY_SOURCE_DIR,
) -> Path:
    """Write the safety classifier's model folder under ``repo_dir`` and return it. ``config_path`` is the
    safety config the model loads (the JSON of ``SLUICE_SAFETY_CONFIG``); None: the built-in PII rules."""
    if not _MODEL_NAME_RE.match(model_name):
        raise ValueError(f"model name must match {_MODEL_NAME_RE.pattern}, got {model_name!r}")
    if config_path is not None and not Path(config_path).is_file():
        raise ValueError(f"safety config {config_path} is not a file")
    values = {
        "model_name": model_name,
        "config_path": "" if config_path is None else str(Path(config_path).resolve()),
    }
    config = fill_template((source_dir / TEMPLATE_NAME).read_text(), values)
    return _write_model(repo_dir, model_name, config, source_dir)


def _write_model(out_dir: Path, model_name: str, config: str, source_dir: Path) -> Path:
    """Swap in ``out_dir/model_name`` holding ``config.pbtxt`` and ``1/model.py`` from ``source_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / model_name
    staging = Path(tempfile.mkdtemp(prefix=f".{model_name}.", dir=out_dir))
    try:
        (staging / "config.pbtxt").write_text(config)
        (staging / "1").mkdir()
        shutil.copy2(source_dir / "1" / "model.py", staging / "1" / "model.py")
        staging.chmod(0o755)  # mkdtemp makes it 0700
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def optional_float(text: str) -> float | None:
    """A number, or None for 'none' or '' (how the command line turns an optional knob off)."""
    return None if text.strip().lower() in ("", "none") else float(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Render the Triton model repository: the CPU engine and the safety classifier."
    )
    parser.add_argument("--out", required=True, type=Path, help="model repository folder to write into")
    parser.add_argument("--checkpoint-dir", required=True, type=Path)
    parser.add_argument("--model-name", default=CpuEngineModelSettings.model_name)
    parser.add_argument("--num-kv-blocks", type=int, default=CpuEngineModelSettings.num_kv_blocks)
    parser.add_argument("--block-size-tokens", type=int, default=CpuEngineModelSettings.block_size_tokens)
    parser.add_argument("--step-token-budget", type=int, default=CpuEngineModelSettings.step_token_budget)
    parser.add_argument("--max-num-running", type=int, default=CpuEngineModelSettings.max_num_running)
    parser.add_argument("--target-step-ms", type=float, default=None)
    parser.add_argument(
        "--prefill-step-stretch",
        type=optional_float,
        default=CpuEngineModelSettings.prefill_step_stretch,
        help="a step with prefill takes at most about this many decode-only steps ('none': no limit)",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPE_SETTINGS,
        default=None,
        help="the engine's number format (default: SLUICE_ENGINE_DTYPE, else auto)",
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
    return CpuEngineModelSettings(
        checkpoint_dir=args.checkpoint_dir,
        model_name=args.model_name,
        num_kv_blocks=args.num_kv_blocks,
        block_size_tokens=args.block_size_tokens,
        step_token_budget=args.step_token_budget,
        max_num_running=args.max_num_running,
        target_step_ms=args.target_step_ms,
        prefill_step_stretch=args.prefill_step_stretch,
        dtype=args.dtype or get_settings().engine_dtype,
        cancellation_check_period_ms=args.cancellation_check_period_ms,
        yield_send_interval_ms=args.yield_send_interval_ms,
    )


if __name__ == "__main__":
    sys.exit(main())
