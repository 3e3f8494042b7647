"""A model version's artifact as a local folder: the one place where the control plane's local replicas
(``replicas.local_replicas``) and the gateways (``gateway.routing.router``) turn a
registry ``artifact_uri`` into files they can read.

- ``file:///abs/path`` (host empty or ``localhost``) and a plain absolute path: that folder, as it is;
  nothing is copied or checked here.
- ``s3://BUCKET/PREFIX``: the artifact fetched through the weight store (``sluice.weight_store``) into
  the node's content-addressed cache, every file verified against the artifact's sha256 manifest; files
  already cached are not downloaded again, an interrupted download resumes. ``include`` fetches only the
  files it accepts (a gateway needs the tokenizer, ``is_tokenizer_file``, not the weights).
- anything else: ``ArtifactUnavailable``.

``artifact_folder`` blocks (disk, network): call it from a worker thread, never on an event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlparse

from sluice.weight_store import FetchResult, Manifest, WeightStore, WeightStoreError

# What ``sluice.text.TextCodec.from_checkpoint`` reads (config.json: the model's context length).
TOKENIZER_FILES = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "config.json",
        "special_tokens_map.json",
    }
)

StoreFactory = Callable[[], WeightStore]


class ArtifactUnavailable(Exception):
    """The artifact cannot be made a local folder here; the message says which and why."""


@dataclass(frozen=True)
class LocalArtifact:
    """An artifact's local folder, and what it took to get it there."""

    folder: Path
    fetched: FetchResult | None  # None: a local folder, nothing fetched
    elapsed_s: float  # the fetch (with its verification); 0 for a local folder

    @property
    def num_downloaded_bytes(self) -> int:
        return 0 if self.fetched is None else self.fetched.downloaded_bytes

    @property
    def num_downloaded_files(self) -> int:
        return 0 if self.fetched is None else self.fetched.num_downloaded_files


def is_tokenizer_file(relative_path: str) -> bool:
    """The tokenizer's files at the artifact's top level (``TOKENIZER_FILES``)."""
    path = PurePosixPath(relative_path)
    return len(path.parts) == 1 and path.name in TOKENIZER_FILES


def local_artifact_dir(artifact_uri: str) -> Path | None:
    """The folder a ``file://`` URI (host empty or ``localhost``) or an absolute path names; None for
    any other URI (a remote artifact)."""
    parsed = urlparse(artifact_uri)
    if parsed.scheme == "file" and parsed.netloc in ("", "localhost"):
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and artifact_uri.startswith("/"):
        return Path(artifact_uri)
    return None


def is_weight_store_uri(artifact_uri: str) -> bool:
    """An ``s3://`` artifact: fetched through the weight store."""
    return artifact_uri.startswith("s3://")


def artifact_folder(
    artifact_uri: str, store: StoreFactory, *, include: Callable[[str], bool] | None = None
) -> LocalArtifact:
    """The artifact as a local folder (module docstring); ``store`` makes the weight store for an
    ``s3://`` one. Raises ``ArtifactUnavailable`` naming the URI and the reason (an unknown scheme, a
    missing manifest, a file that failed its sha256, the store unreachable)."""
    folder = local_artifact_dir(artifact_uri)
    if folder is not None:
        return LocalArtifact(folder, None, 0.0)
    if not is_weight_store_uri(artifact_uri):
        raise ArtifactUnavailable(
            f"artifact {artifact_uri} is neither a local folder (file://, an absolute path) nor in the "
            "weight store (s3://)"
        )
    started_s = time.monotonic()
    try:
        fetched = store().fetch_artifact(artifact_uri, include=include)
    except WeightStoreError as exc:
        raise ArtifactUnavailable(f"artifact {artifact_uri} not fetched: {exc}") from exc
    return LocalArtifact(fetched.path, fetched, time.monotonic() - started_s)


def artifact_manifest(artifact_uri: str, store: StoreFactory) -> Manifest | None:
    """The manifest of a weight-store artifact, read without fetching it (one small GET: the artifact
    exists and its upload finished); None for a local folder. ``ArtifactUnavailable`` otherwise."""
    if local_artifact_dir(artifact_uri) is not None:
        return None
    if not is_weight_store_uri(artifact_uri):
        raise ArtifactUnavailable(
            f"artifact {artifact_uri} is neither a local folder (file://, an absolute path) nor in the "
            "weight store (s3://)"
        )
    try:
        return store().read_manifest(artifact_uri)
    except WeightStoreError as exc:
        raise ArtifactUnavailable(f"artifact {artifact_uri} unreadable: {exc}") from exc
