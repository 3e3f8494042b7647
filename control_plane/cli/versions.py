"""``sluice versions list|add|set-state``: a model's versions in the registry, through the admin API
(viewer to read, release-manager to change). A version is added ``staged``; ``set-state`` moves it along
staged -> warming (replicas load it) -> serving (a route may give it traffic) -> draining -> retired.
Names, the digest, the URI and the build config are checked here first (exit 2), with the registry's own
rules."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from control_plane.cli.admin_client import AdminApi
from control_plane.cli.admin_commands import EXIT_OK, add_options, model_path, print_json
from control_plane.cli.models import VERSION_HEADERS, version_rows
from control_plane.table import render_table
from sluice.stores.registry.base import (
    InvalidChange,
    VersionState,
    check_artifact_uri,
    check_build_config,
    check_digest,
    check_version_name,
)


def _checked(check: Any) -> Any:
    """An argparse type from one of the registry's input rules: its refusal is a usage error."""

    def parse(text: str) -> Any:
        try:
            return check(text)
        except InvalidChange as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _build_config(text: str) -> dict[str, Any]:
    """A JSON object, inline or ``@path`` to a file holding one."""
    try:
        raw = Path(text[1:]).read_text() if text.startswith("@") else text
        return check_build_config(json.loads(raw))
    except (OSError, ValueError) as exc:  # InvalidChange and JSONDecodeError are ValueErrors
        raise argparse.ArgumentTypeError(f"--build-config: {exc}") from None


def _list(api: AdminApi, args: argparse.Namespace) -> int:
    listing = api.call("GET", f"/models/{model_path(args.model)}/versions")
    if args.json:
        print_json(listing)
    elif not listing["versions"]:
        print(f"{args.model} has no versions yet: `sluice versions add {args.model} VERSION ...`.")
    else:
        print(render_table(VERSION_HEADERS, version_rows(listing["versions"])))
    return EXIT_OK


def _add(api: AdminApi, args: argparse.Namespace) -> int:
    body = {
        "version": args.version,
        "artifact_uri": args.artifact_uri,
        "weights_digest": args.weights_digest,
        "build_config": args.build_config,
    }
    detail = api.call("POST", f"/models/{model_path(args.model)}/versions", body)
    if args.json:
        print_json(detail)
    else:
        print(f"Added {args.model}@{args.version}, staged (registry generation {detail['generation']}).")
        print(f"Next: `sluice versions set-state {args.model} {args.version} warming` so replicas load it.")
    return EXIT_OK


def _set_state(api: AdminApi, args: argparse.Namespace) -> int:
    path = f"/models/{model_path(args.model)}/versions/{args.version}/state"
    detail = api.call("POST", path, {"state": args.state})
    if args.json:
        print_json(detail)
    else:
        state = detail["version"]["state"]
        print(f"{args.model}@{args.version} is {state} (registry generation {detail['generation']}).")
    return EXIT_OK


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``list``, ``add`` and ``set-state`` under ``parser`` (``sluice versions``)."""
    sub = parser.add_subparsers(dest="versions_command", metavar="COMMAND", required=True)
    list_ = sub.add_parser("list", help="a model's versions: state, ready replicas, digest, artifact")
    list_.add_argument("model", metavar="MODEL")
    add_options(list_, _list)

    add = sub.add_parser("add", help="register a version of a model, staged")
    add.add_argument("model", metavar="MODEL")
    add.add_argument("version", metavar="VERSION", type=_checked(check_version_name))
    add.add_argument("--artifact-uri", required=True, type=_checked(check_artifact_uri), help="scheme://...")
    add.add_argument(
        "--weights-digest",
        required=True,
        type=_checked(check_digest),
        help="sha256:<64 hex> over the checkpoint (sluice.weights_digest)",
    )
    add.add_argument(
        "--build-config", type=_build_config, default={}, help="a JSON object, or @file holding one"
    )
    add_options(add, _add)

    set_state = sub.add_parser("set-state", help="move a version along its lifecycle")
    set_state.add_argument("model", metavar="MODEL")
    set_state.add_argument("version", metavar="VERSION", type=_checked(check_version_name))
    set_state.add_argument("state", metavar="STATE", choices=[str(s) for s in VersionState])
    add_options(set_state, _set_state)
