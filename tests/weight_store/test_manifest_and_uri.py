"""The weight store's pure parts: s3:// locations, the manifest's validation and artifact digest, the
resume record, hashing parts in order, and the progress line."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from sluice.weight_store import (
    InvalidUriError,
    Manifest,
    ManifestEntry,
    ManifestError,
    compute_artifact_digest,
    parse_s3_uri,
)
from sluice.weight_store.progress import Progress

SHA_A = "a" * 64
SHA_B = "b" * 64


def test_a_location_parses_into_bucket_and_prefix() -> None:
    uri = parse_s3_uri("s3://weights-1.example/engines/sluice-tiny/3/")
    assert (uri.bucket, uri.prefix) == ("weights-1.example", "engines/sluice-tiny/3")
    assert uri.key("rank0/model.bin") == "engines/sluice-tiny/3/rank0/model.bin"
    assert uri.manifest_key == "engines/sluice-tiny/3/manifest.json"
    assert str(uri.child("x")) == "s3://weights-1.example/engines/sluice-tiny/3/x"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("https://bucket/x", "s3://BUCKET/PREFIX"),
        ("bucket/x", "s3://BUCKET/PREFIX"),
        ("s3://Bad_Bucket/x", "not a valid S3 bucket name"),
        ("s3://ab/x", "not a valid S3 bucket name"),
        ("s3://bucket", "no prefix"),
        ("s3://bucket/", "no prefix"),
        ("s3://bucket/a//b", "'..' path segments"),
        ("s3://bucket/a/../b", "'..' path segments"),
        ("s3://bucket/a\nb", "control characters"),
    ],
)
def test_a_bad_location_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(InvalidUriError, match=says):
        parse_s3_uri(text)


def _manifest(metadata: dict[str, object] | None = None) -> Manifest:
    return Manifest.create(
        [ManifestEntry("weights/rank0.bin", 10, SHA_A), ManifestEntry("config.json", 2, SHA_B)], metadata
    )


def test_the_manifest_round_trips_and_its_digest_depends_only_on_the_files() -> None:
    manifest = _manifest({"build": {"dtype": "float32"}, "weights_digest": "sha256:" + "c" * 64})
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest
    assert [e.path for e in again.files] == ["config.json", "weights/rank0.bin"]  # sorted
    assert _manifest({"other": 1}).artifact_digest == manifest.artifact_digest  # metadata does not count
    assert manifest.artifact_digest == compute_artifact_digest(list(reversed(manifest.files)))
    changed = [
        [ManifestEntry("weights/rank0.bin", 11, SHA_A), ManifestEntry("config.json", 2, SHA_B)],
        [ManifestEntry("weights/rank0.bin", 10, SHA_B), ManifestEntry("config.json", 2, SHA_B)],
        [ManifestEntry("weights/rank1.bin", 10, SHA_A), ManifestEntry("config.json", 2, SHA_B)],
    ]
    assert len({Manifest.create(c).artifact_digest for c in changed} | {manifest.artifact_digest}) == 4


def _doc() -> dict[str, object]:
    doc: dict[str, object] = json.loads(_manifest().to_json())
    return doc


def _with_file(**fields: object) -> dict[str, object]:
    doc = _doc()
    doc["files"] = [{"path": "x.bin", "size_bytes": 1, "sha256": SHA_A, **fields}]
    return doc


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ("{not json", "not valid JSON"),
        ([], "a JSON object"),
        ({**_doc(), "format": "v0"}, "format must be"),
        ({**_doc(), "files": "x"}, "'files' must be a list"),
        ({**_doc(), "files": []}, "at least one file"),
        ({**_doc(), "metadata": []}, "'metadata' must be a JSON object"),
        ({**_doc(), "artifact_digest": "sha256:" + "0" * 64}, "does not match its files"),
        (_with_file(sha256="XYZ"), "64 lowercase hex"),
        (_with_file(size_bytes=-1), "size_bytes must be an integer"),
        (_with_file(size_bytes="1"), "size_bytes must be an integer"),
        (_with_file(path="/etc/passwd"), "must be relative POSIX"),
        (_with_file(path="a/../../x"), "must be relative POSIX"),
        (_with_file(path="a\\b"), "must be relative POSIX"),
        (_with_file(path="manifest.json"), "the manifest's own key"),
        (_with_file(extra=1), "exactly"),
    ],
)
def test_a_malformed_manifest_is_refused_saying_why(doc: object, says: str) -> None:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    with pytest.raises(ManifestError, match=says) as caught:
        Manifest.from_json(text, source="s3://b/p/manifest.json")
    assert str(caught.value).startswith("s3://b/p/manifest.json: ")


def test_a_manifest_may_not_list_a_path_twice_or_a_file_as_a_folder() -> None:
    with pytest.raises(ManifestError, match="listed twice"):
        Manifest.create([ManifestEntry("a", 1, SHA_A), ManifestEntry("a", 1, SHA_A)])
    with pytest.raises(ManifestError, match="as a file and as the folder"):
        Manifest.create([ManifestEntry("a", 1, SHA_A), ManifestEntry("a/b", 1, SHA_A)])
    with pytest.raises(ManifestError, match="JSON-serialisable"):
        Manifest.create([ManifestEntry("a", 1, SHA_A)], {"when": object()})


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_only_and_not_when_quiet() -> None:
    terminal = _Terminal()
    progress = Progress("fetch s3://b/p", 4 * 1024 * 1024, stream=terminal)
    progress.add(1024 * 1024)
    progress.close()
    assert "fetch s3://b/p  1.0/4.0 MiB" in terminal.getvalue()
    assert "MiB/s" in terminal.getvalue() and "ETA" in terminal.getvalue()
    for stream, quiet in ((io.StringIO(), False), (_Terminal(), True)):
        silent = Progress("x", 10, stream=stream, quiet=quiet)
        silent.add(10)
        silent.close()
        assert stream.getvalue() == ""


def test_a_file_hashed_part_by_part_in_any_order_gets_its_sha256(tmp_path: Path) -> None:
    from sluice.weight_store.fetch import _InOrderHash

    data = bytes(range(256)) * 41  # 10,496 bytes: ten parts of 1,000 and one of 496
    path = tmp_path / "f.part"
    path.write_bytes(data)
    sizes = [1000] * 10 + [496]
    fd = os.open(path, os.O_RDONLY)
    try:
        sha = _InOrderHash(fd, sizes, finished={0, 1})  # as after a resume: two parts already there
        for index in (7, 3, 2, 10, 4, 6, 5, 9, 8):
            sha.finished(index)
        assert sha.hexdigest() == hashlib.sha256(data).hexdigest()
        assert _InOrderHash(fd, [], set()).hexdigest() == hashlib.sha256(b"").hexdigest()
    finally:
        os.close(fd)


def test_the_resume_record_keeps_finished_parts_and_ignores_a_torn_line(tmp_path: Path) -> None:
    from sluice.weight_store.cache import PartsRecord

    partial = tmp_path / "x.part"
    partial.write_bytes(b"\0" * 1000)
    path = tmp_path / "x.parts"

    def record(size_bytes: int = 1000, part_size_bytes: int = 100) -> PartsRecord:
        return PartsRecord(path, key="p/x", size_bytes=size_bytes, part_size_bytes=part_size_bytes)

    first = record()
    assert first.open(partial) == set()  # a new download
    for index in (3, 0, 7):
        first.mark_done(index)
    first.close()
    with path.open("a") as f:
        f.write("9")  # killed mid-append: no newline
    resumed = record()
    assert resumed.open(partial) == {0, 3, 7}
    resumed.close()
    partial.write_bytes(b"\0" * 10)  # the partial file is not the size it should be: start over
    for other in (record(), record(size_bytes=10, part_size_bytes=5)):  # the second: another download
        assert other.open(partial) == set()
        other.close()
