"""``sluice models list|show|create``: the registry's models, through the admin API (viewer to read,
release-manager to create). Tables by default, the API's JSON with ``--json``; exit codes as in
``control_plane.cli.admin_commands``."""

from __future__ import annotations

import argparse
from typing import Any

from control_plane.cli.admin_client import AdminApi
from control_plane.cli.admin_commands import EXIT_OK, add_options, model_path, print_json, route_text, when
from control_plane.table import render_table

MODEL_HEADERS = ("MODEL", "VERSIONS", "ROUTE", "CREATED", "DESCRIPTION")
VERSION_HEADERS = ("VERSION", "STATE", "READY", "DIGEST", "ARTIFACT", "UPDATED")


def version_rows(versions: list[dict[str, Any]]) -> list[list[str]]:
    """One row per version (the digest cut to its first 12 hex digits: enough to tell them apart)."""
    return [
        [
            v["version"],
            v["state"],
            str(v["num_ready_replicas"]),
            v["weights_digest"][: len("sha256:") + 12],
            v["artifact_uri"],
            when(v["updated_at"]),
        ]
        for v in versions
    ]


def _list(api: AdminApi, args: argparse.Namespace) -> int:
    listing = api.call("GET", "/models")
    if args.json:
        print_json(listing)
    elif not listing["models"]:
        print("No models yet: add one with `sluice models create NAME`.")
    else:
        rows = [
            [
                m["name"],
                str(len(m["versions"])),
                route_text(m["route"]),
                when(m["created_at"]),
                m["description"],
            ]
            for m in listing["models"]
        ]
        print(render_table(MODEL_HEADERS, rows))
    return EXIT_OK


def print_model(detail: dict[str, Any]) -> None:
    model = detail["model"]
    print(f"Model {model['name']}" + (f": {model['description']}" if model["description"] else ""))
    print(f"Route: {route_text(model['route'])}   (registry generation {detail['generation']})")
    if model["versions"]:
        print()
        print(render_table(VERSION_HEADERS, version_rows(model["versions"])))
    else:
        print(f"No versions yet: `sluice versions add {model['name']} VERSION ...`.")


def _show(api: AdminApi, args: argparse.Namespace) -> int:
    detail = api.call("GET", f"/models/{model_path(args.model)}")
    if args.json:
        print_json(detail)
    else:
        print_model(detail)
    return EXIT_OK


def _create(api: AdminApi, args: argparse.Namespace) -> int:
    detail = api.call("POST", "/models", {"name": args.name, "description": args.description})
    if args.json:
        print_json(detail)
    else:
        print(f"Created model {args.name!r} (registry generation {detail['generation']}).")
        print(f"Next: `sluice versions add {args.name} VERSION --artifact-uri ... --weights-digest ...`.")
    return EXIT_OK


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``list``, ``show`` and ``create`` under ``parser`` (``sluice models``)."""
    sub = parser.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    add_options(sub.add_parser("list", help="every model with its versions and route"), _list)
    show = sub.add_parser("show", help="one model: its versions, their states and ready replicas, its route")
    show.add_argument("model", metavar="MODEL")
    add_options(show, _show)
    create = sub.add_parser("create", help="register a model (not served until it has a route)")
    create.add_argument(
        "name", metavar="NAME", help="as clients will ask for it, e.g. meta-llama/Llama-3.1-8B"
    )
    create.add_argument("--description", default="", help="a line for people")
    add_options(create, _create)
