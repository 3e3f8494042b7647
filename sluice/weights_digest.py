"""The digest that names a model version's weights: what the registry records for a version, what the
renderer writes into the Triton model's ``config.pbtxt`` (parameter ``weights_digest``), and what a
health check reads back from a replica before it may take traffic.

``sha256:<hex>`` over every regular file under the checkpoint (or engine) directory, in sorted relative
path order, each contributing its path, its size and its bytes: renaming, adding or changing any file
changes the digest, and the same files give the same digest on every machine. Symbolic links are
followed to their content (an artifact store may link weights in), directories are not hashed as such.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

DIGEST_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
_CHUNK_BYTES = 1 << 20


def weights_digest(directory: Path) -> str:
    """The digest of every file under ``directory`` (see the module docstring). Raises
    FileNotFoundError for a missing directory and ValueError for one with no files."""
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint directory at {directory}")
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"{directory} holds no files: nothing to digest")
    total = hashlib.sha256()
    for path in files:
        relative = path.relative_to(directory).as_posix().encode()
        total.update(len(relative).to_bytes(8, "big") + relative)
        total.update(path.stat().st_size.to_bytes(8, "big"))
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK_BYTES):
                total.update(chunk)
    return f"sha256:{total.hexdigest()}"


def check_digest(digest: str) -> str:
    """``digest`` if it reads ``sha256:`` and 64 lowercase hex digits, else ValueError."""
    if not DIGEST_PATTERN.fullmatch(digest):
        raise ValueError(f"a weights digest reads sha256:<64 lowercase hex digits>, got {digest!r}")
    return digest


def main(argv: list[str] | None = None) -> int:
    """``python -m sluice.weights_digest DIR``: print the digest to register a version with."""
    import argparse

    parser = argparse.ArgumentParser(description="Print the weights digest of a checkpoint folder.")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    try:
        print(weights_digest(args.directory))
    except (FileNotFoundError, ValueError) as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
