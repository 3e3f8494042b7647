"""``python -m sluice.weight_store``: the weight store for operators.

    python -m sluice.weight_store upload DIR s3://BUCKET/PREFIX [--metadata JSON]
    python -m sluice.weight_store fetch s3://BUCKET/PREFIX [--include GLOB ...]   # prints the folder
    python -m sluice.weight_store manifest s3://BUCKET/PREFIX                      # prints the manifest

Endpoint, cache folder and transfer sizes come from the ``SLUICE_*`` settings; credentials and region
from boto3's usual chain. Exit status 1 with a one-line reason on any weight store error.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from sluice.settings import SettingsError, load_settings
from sluice.weight_store.errors import WeightStoreError
from sluice.weight_store.store import WeightStore
from sluice.weight_store.uri import parse_s3_uri


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.weight_store", description="The weight store, for operators."
    )
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    verbs = parser.add_subparsers(dest="verb", required=True)
    upload = verbs.add_parser("upload", help="upload a folder with its manifest (written last)")
    upload.add_argument("directory", type=Path)
    upload.add_argument("uri")
    upload.add_argument("--metadata", default="{}", help="a JSON object recorded in the manifest")
    fetch = verbs.add_parser("fetch", help="fetch into the local cache and print the folder")
    fetch.add_argument("uri")
    fetch.add_argument(
        "--include", action="append", metavar="GLOB", help="only files whose path matches (repeatable)"
    )
    manifest = verbs.add_parser("manifest", help="print the manifest at a prefix")
    manifest.add_argument("uri")
    return parser


def _include(globs: list[str] | None) -> Callable[[str], bool] | None:
    if not globs:
        return None
    return lambda path: any(fnmatch.fnmatchcase(path, g) for g in globs)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        uri = parse_s3_uri(args.uri)  # bad input fails before any client is made
        metadata = json.loads(args.metadata) if args.verb == "upload" else {}
        if not isinstance(metadata, dict):
            parser.error("--metadata must be a JSON object")
        store = WeightStore.from_settings(load_settings(), quiet=args.quiet)
        if args.verb == "upload":
            print(store.upload_dir(args.directory, uri, metadata).artifact_digest)
        elif args.verb == "fetch":
            print(store.fetch_artifact(uri, include=_include(args.include)).path)
        else:
            print(store.read_manifest(uri).to_json())
    except json.JSONDecodeError as exc:
        parser.exit(1, f"{parser.prog}: error: --metadata is not JSON: {exc}\n")
    except (WeightStoreError, SettingsError, FileNotFoundError) as exc:
        parser.exit(1, f"{parser.prog}: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
