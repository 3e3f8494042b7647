"""``sluice rollout start|advance|pause|resume|rollback|status``: moving a model's traffic to a new
version in steps, through the admin API.

``sluice rollout start MODEL VERSION --steps 1,10,50,100`` puts the canary at the first step at once;
``advance`` takes the next (at 100% the rollout completes and the old version drains); ``rollback`` puts
the old version back at 100% and drains the canary, in one registry write. ``--guard`` (or any bound
flag) lets the control plane advance or roll back by itself on those bounds. ``status`` shows the steps,
the current share and the versions compared on live traffic since the step began.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from control_plane.cli.admin_client import AdminApi
from control_plane.cli.admin_commands import EXIT_OK, add_options, model_path, print_json, route_text, when
from control_plane.table import render_table
from sluice.policy.rollout import GuardBounds, RolloutSteps
from sluice.stores.registry.base import InvalidChange, weights_bp_from_pct

TRAFFIC_HEADERS = (
    "VERSION",
    "ROLE",
    "REQUESTS",
    "ERRORS",
    "ERROR RATE",
    "TOKENS IN",
    "TOKENS OUT",
    "TTFT P95",
    "ITL P95",
)
DEFAULT_BOUNDS = GuardBounds()
DEFAULT_GUARD_INTERVAL_S = 30.0


@dataclass(frozen=True)
class GuardFlag:
    flag: str
    key: str  # in the API's guard body
    kind: type
    default: float
    help: str


GUARD_FLAGS = [
    GuardFlag(
        "--min-requests",
        "min_requests",
        int,
        DEFAULT_BOUNDS.min_requests,
        "requests each version needs in a step before it is judged",
    ),
    GuardFlag(
        "--max-error-rate-increase",
        "max_error_rate_increase",
        float,
        DEFAULT_BOUNDS.max_error_rate_increase,
        "roll back when the canary's error rate exceeds the stable one's by more (0.01: 1 point)",
    ),
    GuardFlag(
        "--max-ttft-p95-ratio",
        "max_ttft_p95_ratio",
        float,
        DEFAULT_BOUNDS.max_ttft_p95_ratio,
        "roll back when the canary's TTFT p95 exceeds this times the stable one's",
    ),
    GuardFlag(
        "--max-itl-p95-ratio",
        "max_itl_p95_ratio",
        float,
        DEFAULT_BOUNDS.max_itl_p95_ratio,
        "the same for the inter-token p95",
    ),
    GuardFlag(
        "--guard-interval-s", "interval_s", float, DEFAULT_GUARD_INTERVAL_S, "how often the guard judges"
    ),
]


def _steps(text: str) -> list[int]:
    """``1,10,50,100`` (percent, the policy's rules) as basis points."""
    try:
        steps = RolloutSteps.parse(text)
        return [weights_bp_from_pct({"step": pct})["step"] for pct in steps.steps_pct]
    except (ValueError, InvalidChange) as exc:  # argparse names the option itself
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--steps: ")) from None


def _guard_body(args: argparse.Namespace) -> dict[str, Any] | None:
    given = {f.key: getattr(args, f.key) for f in GUARD_FLAGS if getattr(args, f.key) is not None}
    if not args.guard and not given:
        return None
    return {f.key: f.default for f in GUARD_FLAGS} | given


def _start(api: AdminApi, args: argparse.Namespace) -> int:
    body = {
        "version": args.version,
        "steps_bp": args.steps,
        "guard": _guard_body(args),
        "reason": args.reason,
    }
    changed = api.call("POST", f"/models/{model_path(args.model)}/rollout", body)
    if args.json:
        print_json(changed)
        return EXIT_OK
    rollout = changed["rollout"]
    print(
        f"Rollout of {args.model} started: {rollout['stable_version']} -> {rollout['canary_version']}, "
        f"canary at {rollout['canary_pct']:g}% now (step 1 of {len(rollout['steps_pct'])})."
    )
    print(f"Route: {route_text(changed['route'])}   (registry generation {changed['generation']})")
    print(_guard_line(rollout["guard"]))
    return EXIT_OK


def _move(api: AdminApi, args: argparse.Namespace) -> int:
    body = {"reason": args.reason} if args.reason else None
    changed = api.call("POST", f"/models/{model_path(args.model)}/rollout/{args.move}", body)
    if args.json:
        print_json(changed)
        return EXIT_OK
    rollout = changed["rollout"]
    print(
        f"Rollout of {args.model}: {rollout['state']}, step {rollout['step_index'] + 1} of "
        f"{len(rollout['steps_pct'])} ({rollout['stable_version']} -> {rollout['canary_version']})."
    )
    print(f"Route: {route_text(changed['route'])}   (registry generation {changed['generation']})")
    return EXIT_OK


def _guard_line(guard: dict[str, Any] | None) -> str:
    if guard is None:
        return "Guard: off (advance with `sluice rollout advance`)."
    return (
        f"Guard: on, every {guard['interval_s']:g} s once each version has {guard['min_requests']} requests "
        f"in the step; rolls back above +{guard['max_error_rate_increase']:.2%} errors, "
        f"{guard['max_ttft_p95_ratio']:g}x TTFT p95 or {guard['max_itl_p95_ratio']:g}x inter-token p95."
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def traffic_rows(traffic: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            t["version"],
            t["role"],
            str(t["num_requests"]),
            str(t["num_errors"]),
            f"{t['error_rate']:.2%}",
            str(t["prompt_tokens"]),
            str(t["output_tokens"]),
            _ms(t["ttft_p95_ms"]),
            _ms(t["itl_p95_ms"]),
        ]
        for t in traffic
    ]


def print_status(status: dict[str, Any]) -> None:
    rollout = status["rollout"]
    if rollout is None:
        print(f"{status['model']} has no rollout. Route: {route_text(status['route'])}.")
        return
    steps = [
        f"[{p:g}%]" if i == rollout["step_index"] else f"{p:g}%" for i, p in enumerate(rollout["steps_pct"])
    ]
    print(
        f"Rollout of {status['model']}: {rollout['stable_version']} -> {rollout['canary_version']}, "
        f"{rollout['state']}, step {rollout['step_index'] + 1} of {len(steps)}"
    )
    print(f"Steps: {' > '.join(steps)}")
    print(f"Route now: {route_text(status['route'])}   (registry generation {status['generation']})")
    started, step_started = when(rollout["started_at"]), when(rollout["step_started_at"])
    print(f"Started {started} by {rollout['started_by']}; this step since {step_started}")
    if rollout["reason"]:
        print(f"Last move's reason: {rollout['reason']}")
    print(_guard_line(rollout["guard"]))
    verdict = status["guard_last"]
    if verdict is not None:
        applied = "" if verdict["applied"] or verdict["action"] == "hold" else " (not applied)"
        print(
            f"Guard's last verdict ({when(verdict['at'])}): {verdict['action']}{applied}: {verdict['reason']}"
        )
    print()
    if status["traffic"] is None:
        print(status["traffic_unavailable"])
        return
    print(f"Live traffic since the step began ({when(status['traffic_since'])}):")
    print(render_table(TRAFFIC_HEADERS, traffic_rows(status["traffic"])))


def _status(api: AdminApi, args: argparse.Namespace) -> int:
    status = api.call("GET", f"/models/{model_path(args.model)}/rollout")
    if args.json:
        print_json(status)
    else:
        print_status(status)
    return EXIT_OK


def register(parser: argparse.ArgumentParser) -> None:
    """Add ``start``, ``advance``, ``pause``, ``resume``, ``rollback`` and ``status`` (``sluice rollout``)."""
    sub = parser.add_subparsers(dest="rollout_command", metavar="COMMAND", required=True)
    start = sub.add_parser("start", help="start moving a model's traffic to VERSION in steps")
    start.add_argument("model", metavar="MODEL")
    start.add_argument("version", metavar="VERSION", help="the canary: warming or serving (loaded)")
    start.add_argument(
        "--steps", required=True, type=_steps, help="the canary's share per step, %%: 1,10,50,100"
    )
    start.add_argument(
        "--guard", action="store_true", help="advance or roll back automatically on the bounds"
    )
    for f in GUARD_FLAGS:
        start.add_argument(
            f.flag,
            dest=f.key,
            type=f.kind,
            default=None,
            help=f"{f.help} (default {f.default:g}; implies --guard)",
        )
    start.add_argument("--reason", default="", help="why, for the audit log")
    add_options(start, _start)

    moves = {
        "advance": "the next step (at 100%% the rollout completes; the old version drains)",
        "pause": "hold the current step: no advance, no guard",
        "resume": "continue a paused rollout at its step",
        "rollback": "the old version back at 100%% and the canary draining, in one registry write",
    }
    for move, help_text in moves.items():
        command = sub.add_parser(move, help=help_text)
        command.add_argument("model", metavar="MODEL")
        command.add_argument("--reason", default="", help="why, for the audit log")
        command.set_defaults(move=move)
        add_options(command, _move)

    status = sub.add_parser(
        "status", help="the steps, the current share, the versions compared on live traffic"
    )
    status.add_argument("model", metavar="MODEL")
    add_options(status, _status)
