"""The manifest of an artifact in the weight store: ``manifest.json`` at its prefix, written last.

It lists every file (relative POSIX path, size, sha256), an artifact digest over that listing, and
free-form metadata (the engine-build pipeline records its build configuration, tool versions, the source
checkpoint's digest and the weights digest there). A prefix without a manifest is an incomplete upload.

The artifact digest is ``sha256:`` over the canonical JSON of ``[[path, size_bytes, sha256], ...]`` sorted
by path: the same files give the same digest wherever and whenever they were uploaded, whatever the
metadata. (It is not ``sluice.weights_digest``, which hashes the bytes of a local folder directly.)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sluice.weight_store.errors import ManifestError
from sluice.weight_store.uri import MANIFEST_NAME

MANIFEST_FORMAT = "sluice-weight-manifest/1"
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_HASH_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class ManifestEntry:
    """One file of an artifact: its path relative to the prefix, its size and the hex sha256 of its bytes."""

    path: str
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Files sorted by path, their artifact digest, and metadata. Build one with ``Manifest.create`` (or
    ``manifest_for_dir``); ``from_json`` checks everything, including that the digest matches the files."""

    files: tuple[ManifestEntry, ...]
    artifact_digest: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, files: list[ManifestEntry], metadata: Mapping[str, Any] | None = None) -> Manifest:
        """A checked manifest of ``files`` (any order) with its digest computed; ManifestError if invalid."""
        ordered = tuple(sorted(files, key=lambda e: e.path))
        _check_entries(ordered)
        meta = _check_metadata(dict(metadata or {}))
        return cls(files=ordered, artifact_digest=compute_artifact_digest(ordered), metadata=meta)

    @property
    def total_bytes(self) -> int:
        return sum(e.size_bytes for e in self.files)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "artifact_digest": self.artifact_digest,
                "files": [
                    {"path": e.path, "size_bytes": e.size_bytes, "sha256": e.sha256} for e in self.files
                ],
                "metadata": self.metadata,
            },
            indent=2,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "manifest") -> Manifest:
        """Parse and check a manifest; ManifestError naming ``source`` and the first problem found."""
        try:
            doc = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{source}: not valid JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise ManifestError(f"{source}: a manifest is a JSON object, got {type(doc).__name__}")
        if doc.get("format") != MANIFEST_FORMAT:
            raise ManifestError(f"{source}: format must be {MANIFEST_FORMAT!r}, got {doc.get('format')!r}")
        raw_files = doc.get("files")
        if not isinstance(raw_files, list):
            raise ManifestError(f"{source}: 'files' must be a list of {{path, size_bytes, sha256}}")
        try:
            entries = [_entry_from_json(item) for item in raw_files]
            manifest = cls.create(entries, _metadata_from_json(doc.get("metadata", {})))
        except ManifestError as exc:
            raise ManifestError(f"{source}: {exc}") from None
        listed = doc.get("artifact_digest")
        if listed != manifest.artifact_digest:
            raise ManifestError(
                f"{source}: artifact_digest {listed!r} does not match its files "
                f"({manifest.artifact_digest}): the manifest was altered or truncated"
            )
        return manifest


def compute_artifact_digest(files: tuple[ManifestEntry, ...] | list[ManifestEntry]) -> str:
    """``sha256:`` over the canonical JSON listing of ``files`` sorted by path (see the module docstring)."""
    listing = [[e.path, e.size_bytes, e.sha256] for e in sorted(files, key=lambda e: e.path)]
    canonical = json.dumps(listing, separators=(",", ":"), ensure_ascii=False).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_for_dir(local_dir: Path, metadata: Mapping[str, Any] | None = None) -> Manifest:
    """Hash every regular file under ``local_dir`` (symlinks followed) into a manifest. Raises
    FileNotFoundError for a missing folder and ManifestError for an empty one or one holding a top-level
    ``manifest.json`` (that key is the manifest's own)."""
    if not local_dir.is_dir():
        raise FileNotFoundError(f"no folder at {local_dir}")
    entries = []
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(local_dir).as_posix()
        entries.append(ManifestEntry(relative, path.stat().st_size, file_sha256(path)))
    if not entries:
        raise ManifestError(f"{local_dir} holds no files: nothing to upload")
    return Manifest.create(entries, metadata)


def _check_entries(files: tuple[ManifestEntry, ...]) -> None:
    if not files:
        raise ManifestError("an artifact lists at least one file")
    seen: set[str] = set()
    for e in files:
        _check_path(e.path)
        if e.path in seen:
            raise ManifestError(f"path {e.path!r} is listed twice")
        seen.add(e.path)
        if isinstance(e.size_bytes, bool) or not isinstance(e.size_bytes, int) or e.size_bytes < 0:
            raise ManifestError(f"{e.path!r}: size_bytes must be an integer >= 0, got {e.size_bytes!r}")
        if not isinstance(e.sha256, str) or not _SHA256_HEX.fullmatch(e.sha256):
            raise ManifestError(f"{e.path!r}: sha256 must be 64 lowercase hex digits, got {e.sha256!r}")
    for path in seen:  # a file may not also be a folder of another file: a/b and a/b/c
        parents = PurePosixPath(path).parents
        clash = next((str(p) for p in parents if str(p) in seen), None)
        if clash is not None:
            raise ManifestError(f"{clash!r} is listed as a file and as the folder of {path!r}")


def _check_path(path: Any) -> None:
    if not isinstance(path, str) or not path:
        raise ManifestError(f"a file path must be a non-empty string, got {path!r}")
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or _CONTROL.search(path):
        raise ManifestError(
            f"path {path!r} must be relative POSIX, without empty, '.' or '..' segments, backslashes "
            "or control characters"
        )
    if path == MANIFEST_NAME:
        raise ManifestError(f"{MANIFEST_NAME!r} at the top is the manifest's own key, not a file's")


def _entry_from_json(item: Any) -> ManifestEntry:
    if not isinstance(item, dict) or set(item) != {"path", "size_bytes", "sha256"}:
        raise ManifestError(f"each file is exactly {{path, size_bytes, sha256}}, got {item!r}")
    return ManifestEntry(item["path"], item["size_bytes"], item["sha256"])


def _metadata_from_json(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestError(f"'metadata' must be a JSON object, got {type(value).__name__}")
    return value


def _check_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    try:
        return dict(json.loads(json.dumps(metadata)))  # JSON-able, and a copy the caller cannot change
    except (TypeError, ValueError) as exc:
        raise ManifestError(f"metadata must be JSON-serialisable: {exc}") from None
