"""The weights digest: stable, and changed by any change to the files it covers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sluice.weights_digest import check_digest, main, weights_digest


def _checkpoint(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "model.safetensors").write_bytes(b"\x00\x01weights")
    (root / "config.json").write_text('{"hidden_size": 64}')
    (root / "sub" / "tokenizer.json").write_text("{}")
    return root


def test_the_same_files_give_the_same_digest_wherever_they_lie(tmp_path: Path) -> None:
    a, b = _checkpoint(tmp_path / "a"), _checkpoint(tmp_path / "b")
    assert weights_digest(a) == weights_digest(b)
    assert check_digest(weights_digest(a)) == weights_digest(a)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: (d / "model.safetensors").write_bytes(b"\x00\x01weightz"),  # one byte
        lambda d: (d / "extra.bin").write_bytes(b""),  # a new, empty file
        lambda d: (d / "config.json").rename(d / "config2.json"),  # a rename
        lambda d: (d / "sub" / "tokenizer.json").unlink(),  # a file gone
    ],
)
def test_any_change_to_the_files_changes_the_digest(tmp_path: Path, change: Callable[[Path], object]) -> None:
    checkpoint = _checkpoint(tmp_path / "c")
    before = weights_digest(checkpoint)
    change(checkpoint)
    assert weights_digest(checkpoint) != before


def test_boundaries_between_files_are_part_of_the_digest(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "a").write_bytes(b"xy")
    (one / "b").write_bytes(b"")
    (two / "a").write_bytes(b"x")
    (two / "b").write_bytes(b"y")
    assert weights_digest(one) != weights_digest(two)


def test_a_missing_or_empty_directory_and_a_malformed_digest_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        weights_digest(tmp_path / "absent")
    with pytest.raises(ValueError, match="no files"):
        weights_digest(tmp_path)
    for bad in ["sha256:abc", "md5:" + "0" * 64, "sha256:" + "A" * 64, ""]:
        with pytest.raises(ValueError):
            check_digest(bad)


def test_the_command_prints_the_digest_or_says_why_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _checkpoint(tmp_path / "c")
    assert main([str(checkpoint)]) == 0
    assert capsys.readouterr().out.strip() == weights_digest(checkpoint)
    with pytest.raises(SystemExit) as exit_:
        main([str(tmp_path / "absent")])
    assert exit_.value.code == 1 and "no checkpoint directory" in capsys.readouterr().err
