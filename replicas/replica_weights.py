"""A local replica's weights: where they come from, how they are checked, and how long its cold start
took (``ColdStart``). The functions block (disk, network): the actuator runs them in its worker threads.

- ``engine_settings``: the CPU engine's settings for a version (one built for a GPU target is refused;
  a CPU build's dtype is used, else this node's);
- ``check_local_folder``: a local folder (``--checkpoint``, a ``file://`` artifact) digests to the
  version's weights digest, checked before any replica is registered;
- ``check_remote_artifact``: an ``s3://`` artifact's manifest is there (its upload finished) and does not
  record other weights than the version's, also before any replica is registered;
- ``pull_weights``: each replica's download and verify phases: the artifact into the node's weight
  cache through ``sluice.artifacts`` (every file checked against its manifest's sha256 by the weight
  store as it arrives; nothing downloaded when the cache holds it), then verified to be the version's
  weights: by the manifest when it records the version's weights digest (its files were just checked
  against it: a second pass over the bytes would cost as much as the download, ~0.6 GiB/s of sha256
  per core here), else by the cached folder's weights digest.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from replicas.local_replica import InvalidReplicaRequest
from replicas.render import DTYPE_SETTINGS, CpuEngineModelSettings, DTypeSetting
from sluice.artifacts import ArtifactUnavailable, StoreFactory, artifact_folder, artifact_manifest
from sluice.stores.registry.base import ModelVersion
from sluice.weights_digest import weights_digest


class PullFailed(Exception):
    """A replica's weights could not be made local and checked; the message is the one-line reason."""


@dataclass
class ColdStart:
    """How long each phase of a replica's start took, in seconds (None: not reached, or not yet).

    ``download_s``: the artifact into the node's weight cache (0 for a local folder; the cache's check
    alone when every file was there: ``num_downloaded_bytes`` 0); ``verify_s``: checking that the local
    folder holds the version's weights, ``verified_by`` how (``manifest``: the fetched files' sha256s,
    whose manifest records the version's digest; ``weights digest``: the folder hashed); ``load_s``: its
    repository rendered and tritonserver started until it reports ready (the engine loading the
    weights; the CPU engine hashes them again first, its own guard); ``first_token_s``: from then until
    it is verified to serve the version's digest and one probe generation made its token (the warm-up).
    """

    artifact_uri: str
    download_s: float | None = None
    num_downloaded_bytes: int = 0
    num_downloaded_files: int = 0
    verify_s: float | None = None
    verified_by: str = ""
    load_s: float | None = None
    first_token_s: float | None = None
    phase: str = "queued"  # the phase running now: download, verify, load, first token; then ready or failed

    @property
    def total_s(self) -> float:
        return sum(s for s in (self.download_s, self.verify_s, self.load_s, self.first_token_s) if s)

    def as_dict(self) -> dict[str, object]:
        """For the admin API: every field, seconds rounded to milliseconds, and ``total_s``."""
        values = {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}
        return {**values, "total_s": round(self.total_s, 3)}

    def describe(self) -> str:
        """One line: ``download 0.41 s (28.6 MB in 5 files), verify 0.00 s (manifest), load 2.93 s, first
        token 0.21 s; 3.55 s in all``."""
        parts = []
        if self.download_s is not None:
            fetched = f"{self.num_downloaded_bytes / 1e6:.1f} MB in {self.num_downloaded_files} files"
            parts.append(f"download {self.download_s:.2f} s ({fetched})")
        if self.verify_s is not None:
            parts.append(f"verify {self.verify_s:.2f} s ({self.verified_by})")
        for name, value in (("load", self.load_s), ("first token", self.first_token_s)):
            if value is not None:
                parts.append(f"{name} {value:.2f} s")
        return f"{', '.join(parts) or 'nothing yet'}; {self.total_s:.2f} s in all"


def engine_settings(
    version: ModelVersion, triton_version: int, weights: Path, engine_dtype: DTypeSetting
) -> CpuEngineModelSettings:
    """The CPU engine's settings to serve ``version`` from ``weights``; InvalidReplicaRequest when local
    replicas cannot run it (built for a GPU target, a name Triton refuses)."""
    target = version.build_config.get("target", "cpu")
    if target != "cpu":
        raise InvalidReplicaRequest(
            f"{version.model} version {version.version} was built for the {target} target; local replicas "
            "run the CPU engine: start it where its engine runs (a GPU node)"
        )
    built_dtype = version.build_config.get("dtype")  # the build's choice, else this node's setting
    try:
        return CpuEngineModelSettings(
            checkpoint_dir=weights, model_name=version.model, model_version=triton_version,
            weights_digest=version.weights_digest,
            dtype=built_dtype if built_dtype in DTYPE_SETTINGS else engine_dtype,
        )  # fmt: skip
    except ValueError as exc:
        raise InvalidReplicaRequest(
            f"cannot serve {version.model} version {version.version}: {exc}"
        ) from None


def check_local_folder(version: ModelVersion, folder: Path) -> float:
    """Seconds it took to check that ``folder`` holds ``version``'s weights; InvalidReplicaRequest."""
    started_s = time.monotonic()
    try:
        digest = weights_digest(folder)
    except (ValueError, OSError) as exc:
        raise InvalidReplicaRequest(
            f"cannot serve {version.model} version {version.version} from {folder}: {exc}"
        ) from None
    if digest != version.weights_digest:
        raise InvalidReplicaRequest(
            f"the checkpoint at {folder} digests to {digest}, but {version.model} version "
            f"{version.version} is {version.weights_digest}: a version's weights never change (register "
            "them as a new version)"
        )
    return time.monotonic() - started_s


def check_remote_artifact(version: ModelVersion, store: StoreFactory) -> None:
    """``version``'s remote artifact can be fetched (its manifest is there) and does not record other
    weights than the version's; InvalidReplicaRequest. Its files are checked once fetched."""
    label = f"{version.model} version {version.version}'s artifact {version.artifact_uri}"
    try:
        manifest = artifact_manifest(version.artifact_uri, store)
    except ArtifactUnavailable as exc:
        why = exc.__cause__ or exc
        raise InvalidReplicaRequest(
            f"{label} is not a local folder and cannot be fetched from the weight store ({why}): pass "
            "the checkpoint folder it was made from"
        ) from None
    recorded = manifest.metadata.get("weights_digest") if manifest is not None else None
    if recorded is not None and recorded != version.weights_digest:
        raise InvalidReplicaRequest(
            f"{label} records weights {recorded}, but the version is {version.weights_digest}"
        )


def pull_weights(cold: ColdStart, version: ModelVersion, store: StoreFactory) -> Path:
    """The download and verify phases, timed into ``cold``: the local folder holding ``version``'s
    weights, or PullFailed saying why not."""
    cold.phase = "download"
    try:
        artifact = artifact_folder(cold.artifact_uri, store)
    except (ArtifactUnavailable, OSError) as exc:
        raise PullFailed(str(exc)) from exc
    cold.download_s = artifact.elapsed_s
    cold.num_downloaded_bytes = artifact.num_downloaded_bytes
    cold.num_downloaded_files = artifact.num_downloaded_files
    cold.phase = "verify"
    started_s = time.monotonic()
    recorded = artifact.fetched.manifest.metadata.get("weights_digest") if artifact.fetched else None
    if recorded == version.weights_digest:
        cold.verify_s, cold.verified_by = time.monotonic() - started_s, "manifest"
        return artifact.folder
    try:
        digest = weights_digest(artifact.folder)
    except (ValueError, OSError) as exc:
        raise PullFailed(f"the fetched artifact at {artifact.folder} is unreadable: {exc}") from exc
    cold.verify_s, cold.verified_by = time.monotonic() - started_s, "weights digest"
    if digest != version.weights_digest:
        raise PullFailed(
            f"{cold.artifact_uri} (fetched to {artifact.folder}) digests to {digest}, but {version.model} "
            f"version {version.version} is {version.weights_digest}"
        )
    return artifact.folder
