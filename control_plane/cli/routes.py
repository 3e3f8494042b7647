"""``sluice routes show|set``: a model's split over its versions, through the admin API.

``sluice routes set MODEL v1=90 v2=10`` gives percentages (to 0.01%, summing to 100); ``--state v2=draining``
changes a version's state in the same registry write (a manual rollback:
``sluice routes set tiny v1=100 --state v1=serving --state v2=draining``). Gateways follow the registry,
so the write is the traffic change. Refused while a rollout of the model is active (``sluice rollout``).
"""

from __future__ import annotations

import argparse

from control_plane.cli.admin_client import AdminApi
from control_plane.cli.admin_commands import EXIT_OK, add_options, model_path, pct, print_json
from control_plane.table import render_table
from sluice.stores.registry.base import InvalidChange, VersionState, check_version_name, weights_bp_from_pct

HEADERS = ("VERSION", "SHARE", "BASIS POINTS")


def _pair(text: str) -> tuple[str, str]:
    version, sep, value = text.partition("=")
    if not sep or not version or not value:
        raise argparse.ArgumentTypeError(f"expected VERSION=VALUE, got {text!r}")
    try:
        check_version_name(version)
    except InvalidChange as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return version, value


def _weight(text: str) -> tuple[str, int]:
    """``v1=90`` (percent) as ``("v1", 9000)`` basis points."""
    version, value = _pair(text)
    try:
        return version, weights_bp_from_pct({version: float(value)})[version]
    except (ValueError, InvalidChange) as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: a percentage to 0.01% expected ({exc})") from None


def _state(text: str) -> tuple[str, str]:
    version, value = _pair(text)
    if value not in set(VersionState):
        raise argparse.ArgumentTypeError(f"{text!r}: state must be one of {', '.join(VersionState)}")
    return version, value


def print_route(model: str, route: list[dict[str, int | str]] | None, generation: int) -> None:
    if not route:
        print(f"{model} has no route: it is not served (registry generation {generation}).")
        return
    rows = [[str(e["version"]), pct(int(e["weight_bp"])), str(e["weight_bp"])] for e in route]
    print(render_table(HEADERS, rows))
    print(f"(registry generation {generation})")


def _show(api: AdminApi, args: argparse.Namespace) -> int:
    view = api.call("GET", f"/models/{model_path(args.model)}/route")
    if args.json:
        print_json(view)
    else:
        print_route(args.model, view["route"], view["generation"])
    return EXIT_OK


def _set(api: AdminApi, args: argparse.Namespace) -> int:
    weights = dict(args.weights)
    states = dict(args.state or [])
    body = {"weights_bp": weights, "version_states": states or None}
    view = api.call("PUT", f"/models/{model_path(args.model)}/route", body)
    if args.json:
        print_json(view)
    else:
        print(f"Route of {args.model} set:")
        print_route(args.model, view["route"], view["generation"])
    return EXIT_OK


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``show`` and ``set`` under ``parser`` (``sluice routes``)."""
    sub = parser.add_subparsers(dest="routes_command", metavar="COMMAND", required=True)
    show = sub.add_parser("show", help="a model's split over its versions")
    show.add_argument("model", metavar="MODEL")
    add_options(show, _show)
    set_ = sub.add_parser("set", help="replace a model's split in one registry write: MODEL v1=90 v2=10")
    set_.add_argument("model", metavar="MODEL")
    set_.add_argument("weights", metavar="VERSION=PERCENT", nargs="+", type=_weight)
    set_.add_argument(
        "--state",
        metavar="VERSION=STATE",
        action="append",
        type=_state,
        help="change a version's state in the same write (repeatable)",
    )
    add_options(set_, _set)
