"""Run one build: refuse what cannot run before doing anything, skip what was already built, fetch and
check the source, plan (``build_engines.plan``), print the plan on ``--dry-run`` and stop, or execute
it step by step, each step logging one progress line.

    result = run_build(spec, store=WeightStore.from_settings(settings), registrar=..., work_dir=tmp)

A dry run of a local checkpoint (``--source DIR``) takes no store (``store=None``) and calls nothing: a
platform team previews a build offline. ``build_local`` builds a local checkpoint's trtllm engine and
stops before the upload (the first-GPU-node check serves it from its work folder).

Idempotent: the artifact's manifest records the source checkpoint's digest (its manifest's artifact
digest), the requested build config and the tool versions; a re-run with the same three finds it and
does nothing (it registers the version if a first run stopped between upload and registration). An
artifact of different inputs at the same place is never overwritten (``BuildConflict``).

The registry is reached through a ``Registrar`` the caller gives (the CLI's goes through the admin API):
this package imports only ``sluice``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from build_engines.checkpoint import check_checkpoint
from build_engines.plan import STEP_COUNTS, BuildPlan, Step, plan_build, tool_versions
from build_engines.repository import (
    ENGINE_SUBDIR,
    render_trtllm,
    trtllm_guided_decoding,
    write_repository,
)
from build_engines.spec import BuildSpec
from build_engines.trtllm_release import EXAMPLES_DIR, TRTLLM_VERSION, version_problem
from replicas.render import CpuEngineModelSettings, render_model_repository
from sluice import artifacts
from sluice.engine_limits import BUILD_CONFIG_KEY, EngineLimits, read_engine_limits
from sluice.weight_store import Manifest, ManifestNotFoundError, WeightStore
from sluice.weights_digest import weights_digest

log = logging.getLogger(__name__)

DEFAULT_TRTLLM_EXAMPLES = EXAMPLES_DIR  # where the build-engine image keeps the release's examples/


class BuildRefused(Exception):
    """The build cannot run here (no GPU, no tensorrt_llm, no such model in the registry): nothing done."""


class BuildConflict(Exception):
    """The destination holds an artifact built from other inputs: versions are immutable."""


class Registrar(Protocol):
    """The registry as the build needs it."""

    def require_model(self, model: str) -> None:
        """Raise (with a clear message) when the model is not in the registry or it cannot be reached."""

    def registered_version(self, model: str, version: str) -> Mapping[str, Any] | None:
        """The version's registry record (``weights_digest``, ``artifact_uri``, ...) or None."""

    def add_version(
        self, model: str, version: str, artifact_uri: str, digest: str, build_config: Mapping[str, Any]
    ) -> None:
        """Register the version, ``staged``."""


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan | None  # None when nothing had to be done
    artifact_uri: str
    weights_digest: str | None
    built: bool  # False: dry run, or the artifact was already there
    registered: bool  # this run registered the version


Say = Callable[[str], None]


def gpu_problem() -> str | None:
    """Why the TensorRT-LLM targets cannot run on this machine, or None when they can."""
    return nvidia_gpu_problem() or version_problem(installed_trtllm())


def nvidia_gpu_problem() -> str | None:
    """Why this machine has no usable NVIDIA GPU (``nvidia-smi -L`` lists none), or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no GPU: nvidia-smi is not on PATH"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no GPU: nvidia-smi -L failed ({exc})"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return f"no GPU: nvidia-smi -L lists none ({(listed.stderr or listed.stdout).strip()[:200]})"
    return None


def installed_trtllm() -> str | None:
    """The importable ``tensorrt_llm``'s version ("unknown" without package metadata), or None."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    try:
        return importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def examples_problem(spec: BuildSpec, examples: Path) -> str | None:
    """Why the trtllm target's convert or quantize script is not where the plan runs it, or None."""
    if spec.target != "trtllm":
        return None
    script = (
        examples / "quantization" / "quantize.py"
        if spec.quantization
        else examples / "models" / "core" / "llama" / "convert_checkpoint.py"
    )
    if not script.is_file():
        return (
            f"{script} does not exist: --trtllm-examples must name TensorRT-LLM's examples/ folder of the "
            f"release this Sluice pins (the build-engine image has it at {EXAMPLES_DIR})"
        )
    return None


def run_build(
    spec: BuildSpec,
    *,
    store: WeightStore | None,
    registrar: Registrar,
    work_dir: Path,
    dry_run: bool = False,
    trtllm_examples: Path = DEFAULT_TRTLLM_EXAMPLES,
    say: Say = print,
) -> BuildResult:
    """Build ``spec`` (module docstring). Raises BuildInputError/BuildRefused before doing anything,
    BuildConflict, CheckpointError, the weight store's errors and ``subprocess.CalledProcessError``."""
    if spec.is_local_source or store is None:
        if not dry_run:
            raise BuildRefused(
                "a build reads its checkpoint from the weight store (the artifact records the source's "
                "digest): a local --source is for --dry-run only"
            )
        return _dry_run_local(spec, work_dir, trtllm_examples, say)
    if spec.target != "cpu" and not dry_run:
        problem = gpu_problem() or examples_problem(spec, trtllm_examples)
        if problem is not None:
            raise BuildRefused(
                f"the {spec.target} target needs an NVIDIA GPU and TensorRT-LLM {TRTLLM_VERSION}: "
                f"{problem}. Nothing was done; --dry-run prints the commands and configurations "
                "without them."
            )
    if not dry_run:
        registrar.require_model(spec.model)
    versions = tool_versions(spec.target)
    source_manifest = store.read_manifest(spec.source)
    key = _build_key(spec, source_manifest, versions)
    existing = _existing_artifact(store, spec)
    if existing is not None and not dry_run:
        return _already_built(spec, existing, key, registrar, say)
    if not dry_run and registrar.registered_version(spec.model, spec.version) is not None:
        raise BuildConflict(
            f"{spec.model}@{spec.version} is already in the registry, with another artifact than "
            f"{spec.dest}: a version is registered once; build a new version"
        )
    if existing is not None:
        same = all(existing.metadata.get(name) == value for name, value in key.items())
        say(
            f"Note: {spec.dest} already holds "
            + ("this build: a real run does nothing." if same else "another build: a real run refuses.")
        )
    size = f"{len(source_manifest.files)} files, {source_manifest.total_bytes} bytes"
    say(f"[1/{STEP_COUNTS[spec.target]}] fetch: {spec.source} ({size})")
    source_dir = store.fetch(spec.source)
    info = check_checkpoint(source_dir)
    plan = plan_build(
        spec,
        source_dir=source_dir,
        info=info,
        work_dir=work_dir,
        source_weights_digest=weights_digest(source_dir),
        versions=versions,
        trtllm_examples=trtllm_examples,
        calib_dir=_calib_dir(spec, store, dry_run),
    )
    if dry_run:
        say(plan.describe())
        say("Dry run: nothing was built, uploaded or registered.")
        return BuildResult(plan, str(spec.dest), None, built=False, registered=False)
    digest, limits = _execute(plan, say)
    if limits is not None:
        plan = replace(plan, build_config={**plan.build_config, BUILD_CONFIG_KEY: limits.to_dict()})
    metadata = {
        **key,
        "build_config": plan.build_config,
        "weights_digest": digest,
        "source_uri": str(spec.source),
    }
    _step(plan, "upload", say)
    manifest = store.upload_dir(plan.artifact_dir, spec.dest, metadata)
    say(f"       uploaded {len(manifest.files)} files, artifact digest {manifest.artifact_digest}")
    registered = _register(spec, registrar, digest, _registry_config(plan.build_config, key), say, plan)
    return BuildResult(plan, str(spec.dest), digest, built=True, registered=registered)


@dataclass(frozen=True)
class LocalBuild:
    """A trtllm engine built from a local checkpoint, kept in the work folder."""

    artifact_dir: Path  # engine/ with the tokenizer and config.json beside it, as an uploaded artifact
    build_config: dict[str, Any]  # as the registry would record it, the engine's own limits included
    weights_digest: str  # the engine's (what its rendered repository reports)


def build_local(
    spec: BuildSpec,
    *,
    work_dir: Path,
    trtllm_examples: Path = DEFAULT_TRTLLM_EXAMPLES,
    say: Say = print,
) -> LocalBuild:
    """Build the local checkpoint folder ``spec`` names into a ``trtllm`` engine under ``work_dir``,
    running the plan's steps up to the render and stopping there: nothing is uploaded or registered
    (``spec.dest`` is never written). For the first-GPU-node check (``sluice trtllm-smoke``), which
    serves what it built from the work folder. Refuses what a real build refuses (BuildRefused)."""
    if spec.target != "trtllm" or not spec.is_local_source:
        raise BuildRefused("a local build is of a local checkpoint folder, for the trtllm target")
    problem = gpu_problem() or examples_problem(spec, trtllm_examples)
    if problem is not None:
        raise BuildRefused(
            f"the trtllm target needs an NVIDIA GPU and TensorRT-LLM {TRTLLM_VERSION}: {problem}"
        )
    if not spec.local_source.is_dir():
        raise BuildRefused(f"checkpoint {spec.local_source}: no such folder")
    if (spec.calib_dataset or "").startswith("s3://"):
        raise BuildRefused("a local build reads no weight store: give --calib-dataset as a local folder")
    say(f"[1/{STEP_COUNTS[spec.target]}] fetch: {spec.local_source} (local: no weight store)")
    plan = _local_plan(spec, work_dir, trtllm_examples, dry_run=False)
    digest, limits = _execute(plan, say)
    assert limits is not None  # the trtllm target reads them from the built engine
    say("       local build: the upload and register steps are not run")
    config = {**plan.build_config, BUILD_CONFIG_KEY: limits.to_dict()}
    return LocalBuild(plan.artifact_dir, config, digest)


def _dry_run_local(spec: BuildSpec, work_dir: Path, examples: Path, say: Say) -> BuildResult:
    """The plan of a build from a local checkpoint folder: no store, no registry, nothing written."""
    if not spec.local_source.is_dir():
        raise BuildRefused(f"--source {spec.source_uri}: no such folder")
    plan = _local_plan(spec, work_dir, examples, dry_run=True)
    say(plan.describe())
    say("Dry run of a local checkpoint: no weight store or registry was contacted; nothing was written.")
    return BuildResult(plan, str(spec.dest), None, built=False, registered=False)


def _local_plan(spec: BuildSpec, work_dir: Path, examples: Path, *, dry_run: bool) -> BuildPlan:
    """The plan of a build from the local checkpoint folder ``spec`` names (no weight store)."""
    source_dir = spec.local_source
    return plan_build(
        spec,
        source_dir=source_dir,
        info=check_checkpoint(source_dir),
        work_dir=work_dir,
        source_weights_digest=weights_digest(source_dir),
        versions=tool_versions(spec.target),
        trtllm_examples=examples,
        calib_dir=_calib_dir(spec, None, dry_run=dry_run),
    )


def _calib_dir(spec: BuildSpec, store: WeightStore | None, dry_run: bool) -> str | None:
    """The local folder quantize.py reads its calibration set from (fetched from the store when the
    spec names an s3:// prefix; a dry run fetches nothing and shows where it would come from)."""
    uri = spec.calib_dataset
    if uri is None:
        return None
    if uri.startswith("s3://"):
        if dry_run or store is None:
            return f"<{uri}, fetched into the weight cache>"
        return str(store.fetch(uri))
    folder = Path(uri).expanduser().resolve()
    if not dry_run and not folder.is_dir():
        raise BuildRefused(f"--calib-dataset {uri}: no such folder")
    return str(folder)


def _build_key(spec: BuildSpec, source: Manifest, versions: dict[str, str]) -> dict[str, Any]:
    """What makes two builds the same build (recorded in the artifact's manifest)."""
    return {
        "target": spec.target,
        "source_digest": source.artifact_digest,
        "requested": spec.build_config(),
        "tool_versions": versions,
    }


def _registry_config(build_config: Mapping[str, Any], key: Mapping[str, Any]) -> dict[str, Any]:
    """The version's build config in the registry: how it was built and from what."""
    return {**build_config, "source_digest": key["source_digest"], "tool_versions": key["tool_versions"]}


def _existing_artifact(store: WeightStore, spec: BuildSpec) -> Manifest | None:
    try:
        return store.read_manifest(spec.dest)
    except ManifestNotFoundError:
        return None


def _already_built(
    spec: BuildSpec, existing: Manifest, key: dict[str, Any], registrar: Registrar, say: Say
) -> BuildResult:
    found = {name: existing.metadata.get(name) for name in key}
    if found != key:
        differing = ", ".join(name for name in key if found[name] != key[name])
        raise BuildConflict(
            f"{spec.dest} already holds an artifact built from other inputs ({differing} differ): "
            "a version's artifact is never replaced; build a new version"
        )
    digest = str(existing.metadata["weights_digest"])
    say(f"Nothing to build: {spec.dest} already holds this build (same source, build config and tools).")
    record = registrar.registered_version(spec.model, spec.version)
    if record is not None:
        if record.get("weights_digest") != digest:
            raise BuildConflict(
                f"{spec.model}@{spec.version} is registered with weights digest "
                f"{record.get('weights_digest')}, the artifact at {spec.dest} has {digest}"
            )
        say(f"Nothing to register: {spec.model}@{spec.version} is in the registry ({record.get('state')}).")
        return BuildResult(None, str(spec.dest), digest, built=False, registered=False)
    registrar.add_version(
        spec.model,
        spec.version,
        str(spec.dest),
        digest,
        _registry_config(existing.metadata["build_config"], key),
    )
    say(f"Registered {spec.model}@{spec.version} staged (the artifact was uploaded by an earlier run).")
    return BuildResult(None, str(spec.dest), digest, built=False, registered=True)


def _step(plan: BuildPlan, name: str, say: Say) -> Step:
    number, step = next((i, s) for i, s in enumerate(plan.steps, 1) if s.name == name)
    say(f"[{number}/{len(plan.steps)}] {step.name}: {step.summary}")
    return step


def _execute(plan: BuildPlan, say: Say) -> tuple[str, EngineLimits | None]:
    """Run the plan's steps up to the upload; returns the weights digest the artifact carries and the
    engine's limits (what the gateway enforces: the built engine's own for trtllm, LLM()'s arguments
    for trtllm-llmapi, none for the CPU engine)."""
    _step(plan, "check", say)
    spec = plan.spec
    if spec.target == "trtllm":
        for name in (s.name for s in plan.steps if s.command):
            step = _step(plan, name, say)
            subprocess.run(step.command, check=True)
        _step(plan, "stage", say)
        _stage_tokenizer(plan.source_dir, plan.artifact_dir)
        limits = read_engine_limits(plan.artifact_dir / ENGINE_SUBDIR)
        say(f"       engine limits {limits.to_dict()}")
        digest = weights_digest(plan.artifact_dir / ENGINE_SUBDIR)
        _step(plan, "render", say)
        # Structured output from the staged tokenizer, as a replica renders it (render_for_replica).
        serving, guided_files = trtllm_guided_decoding(plan.artifact_dir, plan.repository_dir, spec.model)
        files = render_trtllm(
            model_name=spec.model,
            triton_version=spec.triton_version,
            engine_dir=str(plan.artifact_dir / ENGINE_SUBDIR),
            weights_digest_value=digest,
            max_batch_size=spec.max_batch_size,
            serving=serving,
        )
        write_repository(plan.repository_dir, files | guided_files, spec.model, spec.triton_version)
        return digest, limits
    digest = plan.source_weights_digest
    _step(plan, "render", say)
    if spec.target == "cpu":
        settings = CpuEngineModelSettings(
            checkpoint_dir=plan.source_dir,
            model_name=spec.model,
            model_version=spec.triton_version,
            weights_digest=digest,
            dtype=plan.build_config["dtype"],
        )
        render_model_repository(plan.repository_dir, settings)
        return digest, None
    write_repository(plan.repository_dir, plan.rendered, spec.model, spec.triton_version)
    return digest, EngineLimits.from_mapping(plan.build_config, "the llmapi build config")


def _stage_tokenizer(source_dir: Path, out_dir: Path) -> None:
    """What a gateway reads of the checkpoint (its tokenizer, and config.json for the context length) at
    the artifact's top level, beside the engine."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in sorted(artifacts.TOKENIZER_FILES):
        if (source_dir / name).is_file():
            shutil.copyfile(source_dir / name, out_dir / name)


def _register(
    spec: BuildSpec,
    registrar: Registrar,
    digest: str,
    build_config: dict[str, Any],
    say: Say,
    plan: BuildPlan,
) -> bool:
    _step(plan, "register", say)
    record = registrar.registered_version(spec.model, spec.version)
    if record is not None:
        if record.get("weights_digest") != digest:
            raise BuildConflict(
                f"{spec.model}@{spec.version} is already registered with weights digest "
                f"{record.get('weights_digest')}, not {digest}: build a new version"
            )
        say(f"       {spec.model}@{spec.version} was already registered with this digest")
        return False
    registrar.add_version(spec.model, spec.version, str(spec.dest), digest, build_config)
    say(f"       {spec.model}@{spec.version} staged, weights digest {digest}")
    return True
